"""The demo's orchestration: the main job end to end on the local Slurm cluster, with a node loss.

Sequence (each step runs the real ``phoenix`` command a user would type, printed with a ``$`` first):

1. ``phoenix cluster up --run-dir CLUSTER_DIR``: a local Slurm cluster of 6 nodes on 2 leaf switches (one
   left over from an interrupted demo in the same folder is stopped first with ``phoenix cluster down``);
2. ``phoenix data prepare --stdlib PREFIX --max-bytes N`` when the config's dataset does not exist yet;
3. ``phoenix submit --site local CONFIG --run-dir BASE/reference``: the fault-free reference run, waited
   for until its coordinator journals the end;
4. ``phoenix submit ... --run-dir BASE/node-loss``: the same job again (each run writes only under its own run
   directory: a config whose checkpoint, Megatron-LM save or TensorBoard folder lies outside it is
   submitted as ``BASE/<name>-reference.yaml`` and ``BASE/<name>-node-loss.yaml`` with those folders moved
   there, :func:`run_configs`); once it trains,
   ``phoenix inject-fault RUN_DIR --kind kill-node --node NODE --at-step S`` kills every slot of one active
   node at step S (mid-run) and then the node's slurmd (the node goes DOWN in Slurm);
5. ``phoenix status RUN_DIR`` while the job recovers, and again at the end with ``--plot BASE/timeline.png``;
6. the report (:mod:`phoenix_hpc.demo.report`), also written to ``BASE/report.txt``;
7. ``phoenix cluster down --run-dir CLUSTER_DIR`` -- always, also on an error, Ctrl-C or SIGTERM: the daemons
   are stopped by the PIDs ``cluster up`` recorded.

Only one demo runs per work directory at a time (an exclusive ``flock`` on ``WORK_DIR/demo.lock``).

Environment of the commands: ``SLURM_CONF`` of the demo's cluster and ``PHOENIX_CLUSTER_DIR`` (so
``phoenix inject-fault`` finds the cluster whose node it kills) are set in this process once the cluster is
up; everything else is inherited.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from phoenix_hpc.errors import DemoError

#: Exit codes of the demo: 0 identical final state after the hot swap; 1 the demo ran but a check failed
#: (state differs, a job did not finish, no recovery); 2 bad input or environment; 130 interrupted.
EXIT_PASSED, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130

REFERENCE, NODE_LOSS = "reference", "node-loss"
POLL_S = 1.0
WIDE_COLUMNS = 150


DEMO_NODES = 6  # the demo's local cluster: 4 active nodes and 2 spares for gpt-small


def check_node_name(node: str | None) -> None:
    """Refuse, before anything starts, a ``--node`` that is no node of the demo's cluster (pure). Which of its
    nodes hold active slots and which is the batch host is known only once the job runs (:func:`pick_victim`).

    Raises:
        DemoError: ``node`` is not one of the cluster's node names."""
    from phoenix_hpc.slurm.cluster_config import node_names

    names = node_names(DEMO_NODES)
    if node is not None and node not in names:
        raise DemoError(f"--node: {node!r} is not a node of the demo's cluster (allowed: {names[0]} .. {names[-1]}, "
                        "one that holds an active slot of the job, not the batch host)")


@dataclass(frozen=True)
class DemoOptions:
    """What ``phoenix demo`` was asked to do.

    ``steps``: training steps (None: the config's ``training.steps``); ``at_step``: the step the node dies
    in (None: half of the steps); ``node``: the node to kill (None: the node of logical rank 1);
    ``max_bytes``: cap of the dataset built from the standard library; ``timeout_s``: limit of each wait
    (cluster start aside): a job to start, to reach the fault, to end.
    """

    config: Path
    work_dir: Path
    cluster_dir: Path
    steps: int | None = None
    at_step: int | None = None
    node: str | None = None
    max_bytes: int = 4_000_000
    timeout_s: float = 900.0


def default_cluster_dir(work_dir: Path) -> Path:
    """``WORK_DIR/cluster``, or ``$TMPDIR/phx-demo-<hash of WORK_DIR>`` when that path is too long for the
    local cluster (its Unix sockets, :data:`phoenix_hpc.slurm.cluster_config.MAX_RUN_DIR_CHARS`). Either
    way the same work directory always gives the same cluster directory, so a later demo finds a cluster
    an interrupted one left behind."""
    from phoenix_hpc.slurm.cluster_config import MAX_RUN_DIR_CHARS

    d = work_dir.absolute() / "cluster"
    if len(str(d)) <= MAX_RUN_DIR_CHARS:
        return d
    h = hashlib.sha256(str(work_dir.absolute()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"phx-demo-{h}"


def fault_step(steps: int, requested: int | None, live_step: int | None) -> int:
    """The step to kill the node in: ``requested`` or half of ``steps``, but at least two steps after the
    live step (a fault request needs time to reach the slots). Pure.

    Raises:
        DemoError: ``requested`` outside ``2..steps-1``, or the job is already too far for a mid-run fault.
    """
    if requested is not None and not 2 <= requested <= steps - 1:
        raise DemoError(f"--at-step: {requested} is not allowed; choose a step in 2..{steps - 1} "
                        f"(the job trains {steps} steps)")
    step = requested if requested is not None else max(2, steps // 2)
    step = max(step, (live_step or 0) + 2)
    if step > steps - 1:
        raise DemoError(f"the job is already at step {live_step} of {steps}: too late for a mid-run fault; "
                        "run the demo with more steps (--steps)")
    return step


def pick_victim(slots: list[Any], batch_host: str | None, requested: str | None) -> str:
    """The node to kill: ``requested`` or the node of logical rank 1's active slot. Pure over
    :class:`phoenix_hpc.status.model.SlotStatus` objects.

    The batch host is refused: it runs the job's coordinator, and the design recovers lost training
    slots, not a lost control plane (the job would end; docs/design.md section 7).

    Raises:
        DemoError: ``requested`` is the batch host or holds no active slot of the job.
    """
    active = {s.node for s in slots if s.state == "active"}
    if requested is not None:
        if requested == batch_host:
            raise DemoError(f"--node: {requested} is the batch host (it runs the job's coordinator); choose "
                            f"another node with active slots: {', '.join(sorted(active - {batch_host}))}")
        if requested not in active:
            raise DemoError(f"--node: {requested!r} holds no active slot of the job; nodes with active slots: "
                            f"{', '.join(sorted(active))}")
        return requested
    by_rank = sorted((s.logical_rank, s.node) for s in slots if s.state == "active" and s.logical_rank is not None
                     and s.node != batch_host)
    if not by_rank:
        raise DemoError(f"no active slot outside the batch host {batch_host}: nothing to kill")
    preferred = [n for r, n in by_rank if r == 1]
    return preferred[0] if preferred else by_rank[0][1]


def derived_config(example: dict[str, Any], steps: int, data_path: str) -> dict[str, Any]:
    """The example config with ``training.steps`` replaced and ``data.path`` made absolute (the derived file
    lives in another folder). Pure; the input is not changed."""
    out = json.loads(json.dumps(example))
    out.setdefault("training", {})["steps"] = int(steps)
    out.setdefault("data", {})["path"] = data_path
    return out


def outside_run_dir(cfg, run_dir: str | os.PathLike) -> list[str]:
    """The folders a run of ``cfg`` in ``run_dir`` would write outside ``run_dir`` (absolute, or relative ones
    like ``../ckpt``): the names of :func:`phoenix_hpc.drills.folders.run_folders` (``checkpoints``,
    ``save_megatron``, ``tensorboard``; ``load_megatron`` is only read). A relative ``save_megatron`` is not
    counted (``phoenix submit`` refuses it). Pure; empty when every run of ``cfg`` keeps to its own folder."""
    from phoenix_hpc.drills.folders import run_folders

    rd = os.path.normpath(os.path.abspath(run_dir))
    out = []
    for name, folder in run_folders(cfg, rd).items():
        if name == "load_megatron" or folder is None or not os.path.isabs(folder):
            continue
        if os.path.commonpath([rd, os.path.normpath(folder)]) != rd:
            out.append(name)
    return out


def run_configs(cfg, steps: int, run_dirs: dict[str, Path]) -> dict[str, str] | None:
    """The config each run of the demo is submitted with, as YAML text, or None when ``cfg`` keeps every run
    in its own run directory already (:func:`outside_run_dir` is empty for every one of ``run_dirs``; the
    user's config, or :func:`derived_config` for ``--steps``, is submitted as it is).

    Otherwise every run gets ``cfg`` with its folders moved under its run directory
    (:func:`phoenix_hpc.drills.folders.isolated_config`: otherwise the node-loss run would start from the
    reference's final checkpoint, and both would write into the user's folders) and ``training.steps`` =
    ``steps``. ``cfg``: a :class:`phoenix_hpc.config.schema.JobConfig` from
    :func:`phoenix_hpc.config.load.load_job_config` (data paths absolute). Pure.

    Raises:
        ConfigError: the changed config fails validation (only folders change: not expected)."""
    from phoenix_hpc.drills.folders import config_data, isolated_config

    if not any(outside_run_dir(cfg, rd) for rd in run_dirs.values()):
        return None
    out = {}
    for run, rd in run_dirs.items():
        run_cfg, _ = isolated_config(cfg, Path(rd).absolute())
        data = config_data(run_cfg)
        data.setdefault("training", {})["steps"] = int(steps)
        out[run] = yaml.safe_dump(data, sort_keys=False)
    return out


class Demo:
    """One demo run. :meth:`run` returns the exit code; the cluster is stopped in every case."""

    def __init__(self, opts: DemoOptions, echo: Callable[[str], None] | None = None):
        self.o = opts
        self.echo = echo or (lambda s: print(s, flush=True))
        self.base = opts.work_dir.absolute() / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self.cluster_started = False
        self.t0 = time.monotonic()

    # --- commands ---------------------------------------------------------------------------------
    def phoenix(self, *args: str, check: bool = True, watch: Callable[[], str | None] | None = None) -> int:
        """Run ``phoenix ARGS`` (the console script of this interpreter), printing the command first; its
        output goes straight to ours. Returns its exit code.

        ``watch``: called every half second while the command runs; when it returns a message, the command
        is stopped (SIGTERM to the PID this method started, SIGKILL after 10 s) and DemoError(message)
        raised. ``check``: raise DemoError when the command fails.
        """
        exe = Path(sys.executable).parent / "phoenix"
        argv = [str(exe)] if exe.exists() else [sys.executable, "-c", "from phoenix_hpc.cli.main import cli; cli()"]
        self.echo(f"\n$ phoenix {' '.join(shlex.quote(self._rel(a)) for a in args)}")
        sys.stdout.flush()
        env = None
        if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
            env = {**os.environ, "COLUMNS": str(WIDE_COLUMNS)}  # a log file: rich tables at a readable width
        proc = subprocess.Popen([*argv, *args], env=env)
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    problem = watch() if watch is not None else None
                    if problem:
                        raise DemoError(problem, exit_code=EXIT_FAILED)
        finally:
            if proc.poll() is None:  # interrupted or given up: stop the command we started, by its PID
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if check and code != 0:
            raise DemoError(f"`phoenix {' '.join(args)}` failed with exit code {code}",
                            exit_code=EXIT_FAILED if code == 1 else 2)
        return code

    @staticmethod
    def _rel(arg: str) -> str:
        """A path argument shown relative to the current folder when it is below it (shorter to read)."""
        if arg.startswith("/"):
            try:
                return str(Path(arg).relative_to(Path.cwd()))
            except ValueError:
                return arg
        return arg

    def say(self, text: str) -> None:
        self.echo(f"\n== [{time.monotonic() - self.t0:5.0f} s] {text}")

    # --- the demo -------------------------------------------------------------------------------------
    def run(self) -> int:
        from phoenix_hpc.config.load import load_job_config

        cfg = load_job_config(self.o.config)  # bad config: ConfigError (exit 2) before anything starts
        steps = self.o.steps or cfg.training.steps
        if self.o.at_step is not None:
            fault_step(steps, self.o.at_step, None)
        if cfg.resources.spares < 1 or not cfg.resilience.enabled:
            raise DemoError(f"--config: {self.o.config} needs resilience.enabled = true and resources.spares >= 1 "
                            f"for a hot swap (got enabled={cfg.resilience.enabled}, spares={cfg.resources.spares})")
        self.o.work_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.o.work_dir / "demo.lock"):
            try:
                self._start_cluster()
                self._prepare_data(Path(cfg.data.path))
                return self._jobs(self._configs(cfg, steps), steps)
            finally:
                self._stop_cluster()

    def _start_cluster(self) -> None:
        from phoenix_hpc.errors import ClusterError
        from phoenix_hpc.slurm import cluster as lc

        cdir = self.o.cluster_dir.absolute()
        try:
            old = lc.load_cluster(cdir)
        except ClusterError:
            old = None
        if old is not None and old.alive_daemons():
            self.say(f"a local cluster from an earlier demo still runs in {cdir}: stopping it")
            self.phoenix("cluster", "down", "--run-dir", str(cdir))
        self.say(f"starting a local Slurm cluster: {DEMO_NODES} nodes on 2 leaf switches (4 active + 2 spare for "
                 "the job)")
        self.cluster_started = True  # from here on, always try to stop it (up stops what it started on failure)
        self.phoenix("cluster", "up", "--run-dir", str(cdir), "--nodes", str(DEMO_NODES), "--switches", "2")
        cluster = lc.load_cluster(cdir)
        os.environ.update(cluster.env)
        os.environ[lc.RUN_DIR_ENV] = str(cdir)

    def _stop_cluster(self) -> None:
        from phoenix_hpc.slurm.cluster import CLUSTER_JSON

        if not self.cluster_started or not (self.o.cluster_dir.absolute() / CLUSTER_JSON).exists():
            return  # nothing was started (cluster up refused before writing anything)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave daemons behind
        try:
            self.say("stopping the local cluster")
            self.phoenix("cluster", "down", "--run-dir", str(self.o.cluster_dir.absolute()), check=False)
        finally:
            signal.signal(signal.SIGINT, old)

    def _prepare_data(self, prefix: Path) -> None:
        if prefix.with_suffix(".bin").is_file() and prefix.with_suffix(".idx").is_file():
            self.say(f"dataset {self._rel(str(prefix))}.bin/.idx exists: using it")
            return
        self.say("building the dataset from this Python's standard library sources")
        prefix.parent.mkdir(parents=True, exist_ok=True)
        self.phoenix("data", "prepare", "--stdlib", str(prefix), "--max-bytes", str(self.o.max_bytes))

    def _configs(self, cfg, steps: int) -> dict[str, Path]:
        """The config file each run is submitted with: the user's (the same for both runs), a derived one with
        ``steps`` (``BASE/<name>``, both runs), or one per run with its own folders
        (``BASE/<stem>-<run>.yaml``, :func:`run_configs`)."""
        runs = {run: self.base / run for run in (REFERENCE, NODE_LOSS)}
        per_run = run_configs(cfg, steps, runs)
        if per_run is None:
            if steps == cfg.training.steps:
                return {run: self.o.config for run in runs}
            from phoenix_hpc.config.load import read_yaml

            self.base.mkdir(parents=True, exist_ok=True)
            path = self.base / self.o.config.name
            path.write_text(f"# {self.o.config.name} with training.steps = {steps} (phoenix demo --steps)\n"
                            + yaml.safe_dump(derived_config(read_yaml(self.o.config), steps, str(cfg.data.path)),
                                             sort_keys=False))
            return {run: path for run in runs}
        outside = sorted({f for rd in runs.values() for f in outside_run_dir(cfg, rd)})
        self.base.mkdir(parents=True, exist_ok=True)
        paths = {}
        for run, text in per_run.items():
            paths[run] = self.base / f"{self.o.config.stem}-{run}.yaml"
            paths[run].write_text(f"# {self.o.config.name} with training.steps = {steps} and its folders under "
                                  f"{runs[run]} (phoenix demo)\n" + text)
        self.say(f"the config's folders for {', '.join(outside)} lie outside the run directories: each run gets "
                 f"its own, under its run directory ({', '.join(self._rel(str(p)) for p in paths.values())})")
        return paths

    def _jobs(self, configs: dict[str, Path], steps: int) -> int:
        from phoenix_hpc.demo.report import compare, format_report

        self.say(f"fault-free reference run: {steps} steps of {self._rel(str(configs[REFERENCE]))}")
        ref_dir = self.base / REFERENCE
        self.phoenix("submit", "--site", "local", str(configs[REFERENCE]), "--run-dir", str(ref_dir))
        self._wait(ref_dir, lambda st: st.finished, "reference run", steps)

        self.say(f"the same job again; a node is killed in the middle of the run")
        job_dir = self.base / NODE_LOSS
        self.phoenix("submit", "--site", "local", str(configs[NODE_LOSS]), "--run-dir", str(job_dir))
        st = self._wait(job_dir, lambda s: s.finished or (s.job.state == "running" and s.job.coordinator is not None
                                                          and any(x.state == "active" for x in s.slots)),
                        "node-loss run to start training", steps)
        if st.finished:
            raise DemoError(f"the node-loss run ended ({st.job.state}) before it trained; see {job_dir}",
                            exit_code=EXIT_FAILED)
        victim = pick_victim(st.slots, st.job.batch_host, self.o.node)
        known = [s for s in (st.job.step, live_step(job_dir)) if s is not None]
        at = fault_step(steps, self.o.at_step, max(known) if known else None)
        self.say(f"killing node {victim} (all its slots, then its slurmd) at step {at} of {steps}")

        def missed() -> str | None:
            # A fault fires only in exactly step ``at``: if the job got past it before the request reached
            # the slots, inject-fault would wait for a death that never comes.
            from phoenix_hpc.faults.trigger import read_fired

            live = live_step(job_dir)
            if live is not None and live > at + 2 and not read_fired(job_dir):
                return (f"the job reached step {live} before the fault request for step {at} arrived; nothing "
                        f"was killed; run the demo again with a later --at-step or more --steps")
            return None

        self.phoenix("inject-fault", str(job_dir), "--kind", "kill-node", "--node", victim, "--at-step", str(at),
                     watch=missed)
        self._wait(job_dir, lambda s: s.finished or bool(s.recoveries), "the recovery to start", steps, quiet=True)
        self.say("the job's status during the recovery")
        self.phoenix("status", str(job_dir), check=False)
        self._wait(job_dir, lambda s: s.finished, "node-loss run", steps)

        timeline = self.base / "timeline.png"
        self.say("the job's status at the end, and its timeline picture")
        self.phoenix("status", str(job_dir), "--plot", str(timeline), check=False)

        ref, flt = _load_summary(ref_dir), _load_summary(job_dir)
        verdict = compare(ref, flt)
        text = format_report(ref, flt, verdict, timeline=str(timeline) if timeline.exists() else None,
                             fault_node=victim, demo_wall_s=time.monotonic() - self.t0)
        report = self.base / "report.txt"
        report.write_text(text.lstrip("\n") + "\n")
        self.echo(text)
        self.echo(f"this report is also in {report}")
        return EXIT_PASSED if verdict.passed else EXIT_FAILED

    def _wait(self, run_dir: Path, until: Callable, what: str, steps: int, quiet: bool = False):
        """Poll the job's status until ``until(status)``; a progress line every few seconds."""
        from phoenix_hpc.slurm.client import SlurmClient
        from phoenix_hpc.status.collect import collect_status

        client = SlurmClient()
        deadline = time.monotonic() + self.o.timeout_s
        last_line, last_print = None, 0.0
        while True:
            st = collect_status(run_dir, client)
            if until(st):
                return st
            now = time.monotonic()
            live = live_step(run_dir)
            line = (f"   {what}: job {st.job.job_id} {st.job.slurm_state or '-'}, {st.job.state}, step "
                    f"{live if live is not None else '-'}/{steps}")
            if not quiet and line != last_line and now - last_print >= 5.0:
                self.echo(line)
                last_line, last_print = line, now
            if st.finished:
                return st
            if now > deadline:
                raise DemoError(f"timed out after {self.o.timeout_s:.0f} s waiting for {what} (job "
                                f"{st.job.job_id}, state {st.job.state}, step {st.job.step}); its output is in "
                                f"{run_dir}/slurm-{st.job.job_id}.out", exit_code=EXIT_FAILED)
            time.sleep(POLL_S)


def live_step(run_dir: Path) -> int | None:
    """The newest step any active rank has finished: the largest ``step`` among the last lines of
    ``RUN_DIR/ranks/rank*.steps.jsonl`` (written by every rank after each step; finer-grained than the
    journal's heartbeat summaries). None before the first step."""
    best = None
    for p in (run_dir / "ranks").glob("rank*.steps.jsonl"):
        try:
            with open(p, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                tail = f.read().decode(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(tail):
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn or partial line
            best = step if best is None else max(best, step)
            break
    return best


def _load_summary(run_dir: Path):
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.demo.report import summarize_run

    try:
        job_id = str(json.loads((run_dir / "job.json").read_text())["job_id"])
    except (OSError, ValueError, KeyError):
        job_id = None
    records = read_journal(run_dir) if (run_dir / "journal.jsonl").exists() else []
    ranks = []
    for p in sorted((run_dir / "ranks").glob("rank*.json")):
        try:
            ranks.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    from phoenix_hpc.faults.trigger import read_fired

    return summarize_run(str(run_dir), job_id, records, ranks, read_fired(run_dir))


class _exclusive:
    """An exclusive, non-blocking ``flock`` on ``path`` for the lifetime of the ``with`` block."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.fd, 64).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise DemoError(f"--work-dir: another demo runs in {self.path.parent} (pid {holder}); wait for it "
                            "or use another --work-dir") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
        return False
