"""Control-plane benchmark: the real coordinator process against thousands of simulated ranks.

``python -m phoenix_hpc.bench.control_plane [--ranks 1000,4000,16000] [--steady-s 12] [--json FILE]
[--update-benchmarks DIR]`` (``scripts/bench-control-plane`` runs it).

Per rank count N it starts ``python -m phoenix_hpc.control.coordinator`` (default timings: heartbeat every
1 s, timeout 10 s; journal summaries every 2 s) in a run directory of its own, and N + 16 simulated slots
(N active on the grid tp = pp = 1, dp = N, 8 per node, and 2 spare nodes) in worker processes of
:mod:`phoenix_hpc.bench.ctlsim`, each simulated node sending one ``heartbeats`` message per interval for its
slots with their commit reports, as real nodes do (:mod:`phoenix_hpc.control.node_beats`). It measures,
each from the coordinator's journal or process:

- *heartbeat age at handling* p50 / p99 (:mod:`phoenix_hpc.control.loadstats`; the worst p99 of the
  steady windows), the slot heartbeats and the messages the coordinator handled per second;
- *coordinator CPU*: its process CPU time (all threads, the TCPStore server included) over wall time in
  the steady window, in cores, and per handled message;
- *detection after an exit*: a spare slot's process "exits" (its liveness connection closes) -> the
  journal's ``slots_dead``; *detection after silence*: another spare stops heartbeating with its
  connection open -> ``slots_dead`` (expected: the 10 s timeout after its last heartbeat);
- *recovery plan*: an active slot exits; ``slots_dead`` -> ``recovery_start`` (quiesce sent) ->
  ``recovery_plan`` (every survivor answered) -> ``recovery_plan_sent`` (plan made and pushed to every
  member's queue: ``plan_s``, ``send_s``) -> the last member read it (after its doorbell rang);
- *registration*: the longest time a simulator waited from its first ``register`` request to its last
  answer (``register_s``), and from spawning the simulators to every slot registered (``sim_start_s``).

The run directories are on disk (the temporary directory), like a job's run directory, so the journal's
``fsync`` costs what it costs there.

Numbers of one run on one machine, where simulators and coordinator share the cores; the simulators'
achieved send rate is reported next to the nominal one. Exit codes: 0 measured; 2 bad option.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P

PER_NODE = 8
SPARE_NODES = 2
SUMMARY_S = 2.0


def _cpu_s(pid: int) -> float:
    """CPU time (user + system, all threads) of a live process, seconds, from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Follower:
    """Reads a growing journal incrementally (only the bytes added since the last read; each complete line is
    parsed once) and keeps the records of the events asked for. Re-reading the whole journal every 50 ms
    costs the driver a core at 16k slots (16k ``registered`` lines), CPU the coordinator then lacks."""

    def __init__(self, run_dir: Path, events: tuple[str, ...]):
        self.path = run_dir / "journal.jsonl"
        self.events = set(events)
        self.records: dict[str, list[dict]] = {e: [] for e in events}
        self._offset = 0
        self._tail = b""

    def read(self, event: str) -> list[dict]:
        """The records of ``event`` so far, in journal order."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        self._offset += len(data)
        data, cut = self._tail + data, (self._tail + data).rfind(b"\n")
        self._tail = data[cut + 1:]
        for line in data[:cut + 1].splitlines():
            if any(f'"event":"{e}"'.encode() in line for e in self.events):
                rec = json.loads(line)
                if rec.get("event") in self.events:
                    self.records[rec["event"]].append(rec)
        return self.records[event]

    def wait(self, event: str, pred, timeout_s: float) -> dict | None:
        """The first record of ``event`` for which ``pred`` holds, waiting up to ``timeout_s`` seconds."""
        deadline = time.time() + timeout_s
        while True:
            for r in self.read(event):
                if pred(r):
                    return r
            if time.time() >= deadline:
                return None
            time.sleep(0.05)


_EVENTS = (E.SlotsDead.NAME, E.HeartbeatSummary.NAME, E.RecoveryStart.NAME, E.RecoveryPlanned.NAME, E.RecoveryPlanSent.NAME)


def _slots(n: int) -> list[dict[str, Any]]:
    out = [{"world_rank": w, "node": f"sim{w // PER_NODE:05d}", "role": "active", "logical_rank": w}
           for w in range(n)]
    for i in range(SPARE_NODES * PER_NODE):
        w = n + i
        out.append({"world_rank": w, "node": f"sim{w // PER_NODE:05d}", "role": "standby", "logical_rank": None})
    return out


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_one(n: int, *, steady_s: float, workers: int, step_s: float, base: Path, log=print) -> dict[str, Any]:
    """Measure the control plane at ``n`` active simulated slots (see the module docstring); a dict of
    numbers (seconds, cores, messages per second)."""
    _raise_fd_limit()
    run_dir = Path(tempfile.mkdtemp(prefix=f"ctl{n}-", dir=base))
    coord_log = open(run_dir.parent / f"{run_dir.name}.coordinator.log", "w")
    t_start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "phoenix_hpc.control.coordinator", "--run-dir", str(run_dir),
                             "--host", "127.0.0.1", "--summary-interval-s", str(SUMMARY_S)],
                            stdout=coord_log, stderr=subprocess.STDOUT, preexec_fn=_raise_fd_limit)
    procs: list = []
    pipes: list = []
    try:
        info = None
        while info is None and time.time() - t_start < 60 and proc.poll() is None:
            info = P.read_coordinator_file(run_dir)
            time.sleep(0.05)
        if info is None:
            raise RuntimeError(f"the coordinator did not start (see {coord_log.name})")
        secret = P.read_secret(run_dir).decode()
        jr = _Follower(run_dir, _EVENTS)
        slots = _slots(n)
        ctx = mp.get_context("spawn")
        t0 = time.time()
        node_of_worker = {}  # whole nodes per worker: a node's slots are in one heartbeats message
        for s in slots:
            node_of_worker.setdefault(s["node"], len(node_of_worker) % workers)
        for k in range(workers):
            mine = [s for s in slots if node_of_worker[s["node"]] == k]
            a, b = ctx.Pipe()
            spec = {"host": "127.0.0.1", "port": info["port"], "liveness_port": info["liveness_port"],
                    "secret": secret, "slots": mine, "active": n, "per_node": PER_NODE, "interval_s": 1.0,
                    "timeout_s": 10.0, "step_s": step_s, "t0": t0, "world_size": len(slots)}
            p = ctx.Process(target=_worker_entry, args=(b, spec), daemon=True)
            p.start()
            procs.append(p)
            pipes.append(a)
        regs = [c.recv() for c in pipes]
        t_start_all = time.time() - t0  # spawning the simulators (each imports torch) and registering
        t_reg = max(r["register_s"] for r in regs)  # a simulator's first request -> its last answer
        registered = sum(r["registered"] for r in regs)
        log(f"[ctl {n}] {registered}/{len(slots)} slots registered in {t_reg:.1f} s ({t_start_all:.1f} s with "
            f"starting the simulators) "
            f"({', '.join(x for r in regs for x in r['refused'])})")
        if registered != len(slots):
            raise RuntimeError(f"only {registered} of {len(slots)} simulated slots registered: "
                               f"{[r['refused'] for r in regs]}")
        owner = {s["world_rank"]: pipes[node_of_worker[s["node"]]] for s in slots}

        def ask(w: int | None, cmd: str, arg=None):
            c = owner[w] if w is not None else None
            c.send((cmd, arg))
            return c.recv()

        def ask_all(cmd: str, arg=None) -> list[dict]:
            for c in pipes:
                c.send((cmd, arg))
            return [c.recv() for c in pipes]

        time.sleep(2.5)  # warm-up: every slot beat at least twice
        spare_silent, spare_exit, victim = n, n + PER_NODE, n // 2 + 1  # the spares on two nodes
        rep0 = ask_all("report")
        cpu0, w0 = _cpu_s(proc.pid), time.time()
        silent = ask(spare_silent, "silence", spare_silent)
        time.sleep(steady_s / 2)
        exited = ask(spare_exit, "exit", spare_exit)
        time.sleep(steady_s / 2)
        cpu1, w1 = _cpu_s(proc.pid), time.time()
        rep1 = ask_all("report")
        sent = sum(r["entries"] for r in rep1) - sum(r["entries"] for r in rep0)
        sent_msgs = sum(r["beats"] for r in rep1) - sum(r["beats"] for r in rep0)
        commits = sum(r["commits"] for r in rep1) - sum(r["commits"] for r in rep0)
        # the silent spare is found 10 s after its last heartbeat: wait for it if the window was shorter
        d_silent = jr.wait(E.SlotsDead.NAME, lambda r: spare_silent in r["slots"] and r["ts"] >= w0, 30)
        d_exit = jr.wait(E.SlotsDead.NAME, lambda r: spare_exit in r["slots"] and r["ts"] >= exited["t_exit"], 10)
        # the handled rates come from the summaries around the window: wait for the first one after it (the
        # detections above may have returned before it was written; then the column came out empty)
        jr.wait(E.HeartbeatSummary.NAME, lambda r: r["ts"] >= w1, 3 * SUMMARY_S)
        all_summaries = list(jr.read(E.HeartbeatSummary.NAME))
        summaries = [r for r in all_summaries if w0 <= r["ts"] <= w1 + 0.5]
        # --- an active slot exits: detection, quiesce, plan, delivery ------------------------------------
        ask_all("watch")
        victim_exit = ask(victim, "exit", victim)
        d_victim = jr.wait(E.SlotsDead.NAME, lambda r: victim in r["slots"] and r["ts"] >= victim_exit["t_exit"], 30)
        early = [r for r in jr.read(E.SlotsDead.NAME) if r["ts"] < w0]
        sent_rec = jr.wait(E.RecoveryPlanSent.NAME, lambda r: True, 60)
        members = n
        got: dict[int, float] = {}
        deadline = time.time() + 60
        while sent_rec is not None and time.time() < deadline:
            got = {}
            for r in ask_all("report"):
                got.update({int(k): v for k, v in r["received"].items()})
            if len(got) >= members:
                break
            time.sleep(0.2)
        start = (jr.read(E.RecoveryStart.NAME) or [None])[0]
        plan = (jr.read(E.RecoveryPlanned.NAME) or [None])[0]
    finally:
        for c in pipes:
            try:
                c.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        proc.kill()
        proc.wait()
        coord_log.close()
    win = w1 - w0
    hb = [s for s in summaries if s.get("heartbeat_age")]
    handled = handled_msgs = None  # from the summaries around the window: the last before it, the first after
    span = [r for r in all_summaries if r["ts"] <= w0][-1:] + [r for r in all_summaries if r["ts"] >= w1][:1]
    if len(span) == 2 and span[1]["ts"] > span[0]["ts"]:
        handled = (span[1]["heartbeats"] - span[0]["heartbeats"]) / (span[1]["ts"] - span[0]["ts"])
        handled_msgs = (span[1].get("heartbeat_messages", 0) - span[0].get("heartbeat_messages", 0)) \
            / (span[1]["ts"] - span[0]["ts"])
    out: dict[str, Any] = {
        "ranks": n, "slots": len(slots), "nodes": len(slots) // PER_NODE, "slots_per_node": PER_NODE,
        "workers": workers, "heartbeat_interval_s": 1.0,
        "heartbeat_timeout_s": 10.0, "step_s": step_s, "register_s": round(t_reg, 2),
        "sim_start_s": round(t_start_all, 2),
        "window_s": round(win, 2),
        "sent_heartbeats_per_s": round(sent / win, 1), "sent_messages_per_s": round(sent_msgs / win, 1),
        # every commit report rides on its node's heartbeats message (ctlsim.py): none is sent on its own, so
        # there is no sent-commit rate to record (records of the simulator before protocol 3 have one)
        "carried_commits_per_s": round(commits / win, 1),
        "nominal_heartbeats_per_s": float(len(slots)), "nominal_messages_per_s": float(len(slots) // PER_NODE),
        "handled_heartbeats_per_s": None if handled is None else round(handled, 1),
        "handled_messages_per_s": None if handled_msgs is None else round(handled_msgs, 1),
        "coordinator_cores": round((cpu1 - cpu0) / win, 3),
        "heartbeat_age_p50_ms": round(sorted(s["heartbeat_age"]["p50_ms"] for s in hb)[len(hb) // 2], 2) if hb else None,
        "heartbeat_age_p99_ms": round(max(s["heartbeat_age"]["p99_ms"] for s in hb), 2) if hb else None,
        "detect_exit_s": None if d_exit is None else round(d_exit["ts"] - exited["t_exit"], 3),
        "detect_silence_s": None if d_silent is None or not silent.get("t_last_beat") else
        round(d_silent["ts"] - silent["t_last_beat"], 3),
        "detect_active_exit_s": None if d_victim is None else round(d_victim["ts"] - victim_exit["t_exit"], 3),
    }
    msgs = sent_msgs / win
    out["cpu_us_per_message"] = round(1e6 * out["coordinator_cores"] / msgs, 1) if msgs else None
    out["cpu_us_per_slot_heartbeat"] = round(1e6 * out["coordinator_cores"] * win / sent, 1) if sent else None
    if early:  # slots declared dead before the steady window: the run does not show a healthy control plane
        out["error"] = (f"{sum(len(r['slots']) for r in early)} slot(s) declared dead before the steady window "
                        f"(first: {early[0].get('reason', '')[:120]})")
    if d_victim and start and plan and sent_rec:
        out.update({
            "quiesce_s": round(plan["ts"] - start["ts"], 3),
            "detect_to_quiesce_s": round(start["ts"] - d_victim["ts"], 3),
            "plan_s": sent_rec["plan_s"], "plan_send_s": sent_rec["send_s"],
            "plan_delivered_s": round(sent_rec["ts"] - plan["ts"], 3),
            "plan_read_by_all_s": round(max(got.values()) - plan["ts"], 3) if len(got) >= members else None,
            "plan_read_by": len(got),
        })
    else:
        out["recovery_error"] = "no recovery plan was sent within 60 s" if d_victim else "the exit was not detected"
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _worker_entry(conn, spec):
    from phoenix_hpc.bench.ctlsim import worker

    try:
        worker(conn, spec)
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass
    except RuntimeError as exc:  # torch's DistError: the coordinator was stopped while this process swept
        print(f"[ctlsim] stopped: {str(exc).splitlines()[0]}", file=sys.stderr)


def machine() -> dict[str, Any]:
    """CPU model, logical CPUs, Python and torch versions of this host."""
    import torch

    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__}


COLUMNS = (("ranks", "ranks"), ("sent_messages_per_s", "msgs sent/s"), ("handled_messages_per_s", "msgs handled/s"),
           ("handled_heartbeats_per_s", "slot hb handled/s"),
           ("heartbeat_age_p50_ms", "hb age p50 ms"), ("heartbeat_age_p99_ms", "hb age p99 ms"),
           ("coordinator_cores", "coord cores"), ("cpu_us_per_message", "CPU us/msg"),
           ("cpu_us_per_slot_heartbeat", "CPU us/slot hb"),
           ("detect_exit_s", "detect exit s"), ("detect_silence_s", "detect silence s"),
           ("quiesce_s", "quiesce s"), ("plan_s", "plan s"), ("plan_delivered_s", "plan pushed s"),
           ("plan_read_by_all_s", "read by all s"), ("register_s", "register s"))


def table(rows: list[dict]) -> str:
    """The results as a markdown table (one row per rank count)."""
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    sep = "| " + " | ".join("---" for _ in COLUMNS) + " |"
    body = ["| " + " | ".join("-" if r.get(k) is None else f"{r[k]:g}" if isinstance(r.get(k), (int, float))
                              else str(r[k]) for k, _ in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def parse_ranks(text: str) -> list[int]:
    """``"1000,4000"`` -> ``[1000, 4000]``. Raises ValueError naming the value unless every item is an
    integer from 16 to 100000 and a multiple of :data:`PER_NODE` (8)."""
    out = []
    for item in text.split(","):
        try:
            v = int(item)
        except ValueError:
            raise ValueError(f"--ranks: {item!r} is not allowed; expected integers 16..100000 (multiples of {PER_NODE}), "
                             "comma-separated") from None
        if not 16 <= v <= 100_000 or v % PER_NODE:
            raise ValueError(f"--ranks: {v} is not allowed; expected integers 16..100000 (multiples of {PER_NODE})")
        out.append(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.bench.control_plane", description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="1000,4000,16000", help="active simulated ranks per run, comma-separated")
    ap.add_argument("--steady-s", type=float, default=12.0, help="steady window per run, seconds (>= 2)")
    ap.add_argument("--step-s", type=float, default=2.0, help="simulated step time: one commit per rank per step")
    ap.add_argument("--workers", type=int, default=0, help="simulator processes (0: 1 per 2000 slots, 1..8)")
    ap.add_argument("--json", dest="json_path", default=None, help="also write the results to this file")
    ap.add_argument("--update-benchmarks", default=None, metavar="DIR",
                    help="write the section into DIR/BENCHMARKS.md and DIR/BENCHMARKS.json")
    a = ap.parse_args(argv)
    try:
        ranks = parse_ranks(a.ranks)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not a.steady_s >= 2:
        print(f"error: --steady-s: {a.steady_s} is not allowed; expected seconds >= 2", file=sys.stderr)
        return 2
    if not a.step_s > 0:
        print(f"error: --step-s: {a.step_s} is not allowed; expected seconds > 0", file=sys.stderr)
        return 2
    if not 0 <= a.workers <= 64:
        print(f"error: --workers: {a.workers} is not allowed; expected 0..64", file=sys.stderr)
        return 2
    from phoenix_hpc.bench import jobs, report

    bad = report.output_error(a.json_path, a.update_benchmarks)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2

    repo = Path(__file__).resolve().parents[2]
    # the code measured: taken before the runs (the commit, and files that differed from it)
    measured = {"commit": jobs.git_commit(repo), "dirty_files": jobs.dirty_files(repo),
                "command": f"scripts/bench-control-plane --ranks {','.join(map(str, ranks))} --steady-s {a.steady_s:g} "
                           f"--step-s {a.step_s:g} --workers {a.workers}"}
    load_before = os.getloadavg()  # a machine shared with other work inflates the absolute times
    # on disk, like a job's run directory: the journal's fsyncs cost what they cost there (not /dev/shm)
    base = Path(tempfile.mkdtemp(prefix="phx-ctlbench-"))
    rows = []
    t0 = time.time()
    try:
        for n in ranks:
            workers = a.workers or max(1, min(8, (n + 1999) // 2000))
            try:
                row = run_one(n, steady_s=a.steady_s, workers=workers, step_s=a.step_s, base=base)
            except (RuntimeError, OSError) as exc:  # one size that cannot run must not lose the others
                row = {"ranks": n, "slots": n + SPARE_NODES * PER_NODE, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "wall_s": round(time.time() - t0, 1),
              **measured, "load_avg_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
              "machine": machine(), "steady_s": a.steady_s, "runs": rows}
    from phoenix_hpc.bench import control_plane_report as R

    result["analysis"] = R.analyse(rows)
    print(table(rows))
    for line in R.findings(result):
        print(f"- {line}")
    if a.json_path:
        Path(a.json_path).write_text(json.dumps(result, indent=1) + "\n")
    if a.update_benchmarks:
        R.update_benchmarks(Path(a.update_benchmarks), result)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
