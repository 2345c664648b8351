"""The coordinator's supervisor: the batch script runs this, and this runs the coordinator, restarting it
after a crash.

``python -m phoenix_hpc.control.supervise --run-dir RUN_DIR --restarts N [COORDINATOR OPTIONS]``

It starts ``python -m phoenix_hpc.control.coordinator --run-dir RUN_DIR`` and waits for it. The coordinator
writes its verdict to ``RUN_DIR/job_exit_status`` before it exits (0 done, 1 failed, 3 stopped); a process
that ended without it crashed (SIGKILL, OOM kill, an uncaught error) and is started again with ``--restart
K`` (K = 1, 2, ...), at most ``N`` times (``resilience.coordinator_restarts``): the new coordinator rebuilds
its state from the journal and the slots reconnect (:mod:`phoenix_hpc.control.restart`). It is not restarted
when it refused its input (exit code 2: the same input would be refused again) or after this supervisor
passed it a stopping signal (the job is being ended anyway).

Signals: SIGTERM, SIGINT and SIGUSR1 (the time-limit warning) are passed on to the running coordinator; one
that arrives between a crash and the restart is passed on once the restarted coordinator is ready.
Exit status: the coordinator's last one (its verdict when it wrote one); a crash without restarts left
ends with the crashed process's status (128 + signal number for a signal, as a shell reports it).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

COORDINATOR_MODULE = "phoenix_hpc.control.coordinator"
EXIT_BAD_INPUT = 2
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def restart_decision(returncode: int, verdict_written: bool, restarts_done: int, max_restarts: int,
                     stopping: bool) -> tuple[bool, str]:
    """Whether to start the coordinator again after it ended with ``returncode`` (``subprocess``'s: negative
    for a signal). Pure.

    Returns:
        ``(restart, reason)``; the reason says why in words.
    """
    how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    if verdict_written:
        return False, f"the coordinator ended with its verdict ({how})"
    if returncode == EXIT_BAD_INPUT:
        return False, "the coordinator refused its input (exit code 2); a restart would be refused too"
    if stopping:
        return False, f"the coordinator ended ({how}) after it was told to stop; the job ends"
    if restarts_done >= max_restarts:
        return False, (f"the coordinator crashed ({how}) and all {max_restarts} restarts "
                       "(resilience.coordinator_restarts) are used")
    return True, f"the coordinator crashed ({how}) without its verdict; restart {restarts_done + 1} of {max_restarts}"


def shell_status(returncode: int) -> int:
    """``subprocess``'s return code as a shell reports it (a signal ``s``: ``128 + s``). Pure."""
    return 128 - returncode if returncode < 0 else returncode


def _when_ready(run_dir: Path, child: subprocess.Popen, poll_s: float = 0.2) -> None:
    """Wait until ``child`` wrote ``coordinator.json`` (its pid in it) or ended."""
    from phoenix_hpc.control.protocol import read_coordinator_file

    while child.poll() is None:
        info = read_coordinator_file(run_dir)
        if info is not None and info.get("pid") == child.pid:
            return
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring). Exit codes: the coordinator's."""
    from phoenix_hpc.control.protocol import EXIT_STATUS_FILE

    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.control.supervise", description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True, help="the job's run directory")
    ap.add_argument("--restarts", type=int, default=3, help="most restarts after a crash (default 3)")
    args, passed_on = ap.parse_known_args(argv)  # the rest (--host, --port, ...) is the coordinator's
    if args.restarts < 0:
        print(f"error: --restarts: {args.restarts} is negative; give 0 or more", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    state: dict = {"child": None, "stopping": False, "pending": None}

    def forward(signum, _frame) -> None:
        child = state["child"]
        if child is not None and child.poll() is None:
            child.send_signal(signum)
            state["stopping"] = state["stopping"] or signum in STOPPING  # this coordinator was told to stop
        else:  # between a crash and the restart: passed on once the next coordinator is ready
            state["pending"] = signum

    for s in FORWARDED:
        signal.signal(s, forward)
    restarts = 0
    while True:
        cmd = [sys.executable, "-m", COORDINATOR_MODULE, "--run-dir", str(run_dir), *passed_on]
        if restarts:
            cmd += ["--restart", str(restarts)]
        state["child"] = subprocess.Popen(cmd)
        if state["pending"] is not None:
            _when_ready(run_dir, state["child"])  # its signal handlers are installed once it is ready
            if state["child"].poll() is None:
                state["child"].send_signal(state["pending"])
                state["stopping"] = state["stopping"] or state["pending"] in STOPPING
            state["pending"] = None
        rc = state["child"].wait()
        again, why = restart_decision(rc, (run_dir / EXIT_STATUS_FILE).exists(), restarts, args.restarts,
                                      state["stopping"])
        if not again:
            if rc != 0 or restarts:
                print(f"[phoenix] supervisor: {why}", file=sys.stderr, flush=True)
            return shell_status(rc)
        restarts += 1
        print(f"[phoenix] supervisor: {why} (pid {state['child'].pid})", file=sys.stderr, flush=True)
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
