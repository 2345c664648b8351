"""Hot swap end to end on the real local Slurm cluster: the correctness oracle of docs/design.md section 10.

Every job here is submitted with ``phoenix submit --site local`` (the real batch script: coordinator first,
then one srun step over 2 active nodes + 1 spare node), trains a tiny GPT with the torch engine on gloo
(dp=2, one slot per node), protected by the runtime (D2H + H2H over MPI, k=1). A fault-free run gives the
reference final hash (the coordinator's ``job_done.final_hash``: SHA-256 over the ranks' state hashes of
parameters + optimizer shards, in logical-rank order). Each fault test runs the same job, makes a real fault
happen mid-run, and requires:

- the job finishes (``job_done``) with a final hash *identical* to the fault-free one;
- the journal has ``recovery_done`` with ``steps_replayed <= 1`` and the phase timings
  (detect, reconfigure, params, optimizer, replay), one per fault.

Where two faults share a job (each job's start costs more than its training), the job has two spares and the
second fault targets logical rank 0, armed at the start for a later step, so it lands after the first
recovery; the checks are made for each fault.

Tests parametrized with ``path`` run the job on the recovery paths (docs/design.md section 6): ``rebind``
(the torch engine's own, ``resilience.recovery_path: auto``) and ``rebuild`` (every member tears its engine
down and builds a new one; the process crash: in one phase); each checks in the ranks' summaries which path
ran. A fault-free run never
recovers, so one reference serves both.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.control.journal import read_journal
from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm import procs
from phoenix_hpc.slurm.client import SlurmClient
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = str(ROOT / ".venv" / "bin" / "phoenix")

pytestmark = pytest.mark.cluster

STEPS = 40
CONFIG = {
    "name": "hotswap",
    "engine": "torch",
    "model": {"layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 256, "seq_length": 32},
    "parallelism": {"tp": 1, "pp": 1, "dp": 2},
    "training": {"steps": STEPS, "micro_batch_size": 2, "global_batch_size": 8, "seed": 7, "lr": 0.001,
                 "warmup_steps": 2, "log_interval": 10},
    "resilience": {"k": 1, "placement_levels": ["node", "switch"], "heartbeat_interval_s": 0.5,
                   "heartbeat_timeout_s": 4.0, "collective_timeout_s": 8.0, "chunk_bytes": 65536},
    "resources": {"nodes": 2, "spares": 1, "time_limit": "00:04:00"},
}
PHASES = {"detect", "reconfigure", "params", "optimizer", "replay"}
PATHS = ["rebind", "rebuild"]


def with_path(config: dict, path: str) -> dict:
    """``config`` on recovery path ``path``: ``rebind`` is the torch engine's own (``auto``), ``rebuild`` is
    asked for with ``resilience.recovery_path``."""
    if path == "rebind":
        return config
    return dict(config, resilience=dict(config["resilience"], recovery_path=path))


def check_path(job: "Job", config: dict, path: str) -> None:
    """Every member of the final generation ran every recovery it took part in on ``path``: on ``rebuild``
    each built a new engine and each survivor tore its old one down first; on ``rebind`` none did. A member
    that joined is a survivor in every later recovery (its first recovery is the one it joined in)."""
    p = config["parallelism"]
    for r in range(p.get("tp", 1) * p.get("pp", 1) * p["dp"]):
        summary = json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text())
        recs = summary["recoveries"]
        assert recs and {x["path"] for x in recs} == {path}, (r, recs)
        for i, x in enumerate(recs):
            joined = summary["joined"] and i == 0
            torn_down, built = "teardown" in x["detail"], "engine" in x["detail"]
            if path == "rebuild":
                assert built and torn_down != joined, (r, joined, x)
            else:
                assert not torn_down and built == joined, (r, joined, x)


_wait = wait_for

class Job:
    """One submitted job: its run dir, Slurm id and journal."""

    def __init__(self, env: dict[str, str], tmp: Path, data: Path | dict, name: str, config: dict | None = None):
        """Submit ``config`` (default: :data:`CONFIG`) with ``data.path`` set to ``data`` (a mapping: the whole
        ``data`` section, e.g. a blend).

        ``phoenix submit`` runs in this process (click's runner, ``env`` as its environment, which sbatch
        passes on to the job): the same command without a fresh interpreter's start and imports, seconds per
        job on a loaded host (the executable itself submits in tests/e2e/test_submit.py, test_readme_tour.py
        and the resume tests). A config that names user code (``python_path``) is submitted by the executable,
        so that the submit's import of that code stays out of this process, as it stays out of a user's
        shell."""
        self.env = env
        self.run_dir = tmp / name
        cfg = dict(config or CONFIG, data=dict(data) if isinstance(data, dict) else {"path": str(data)})
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        args = ["submit", "--site", "local", str(path), "--run-dir", str(self.run_dir), "--json"]
        if "python_path" in cfg:
            out = subprocess.run([PHOENIX, *args], env=env, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr
            stdout = out.stdout
        else:
            from click.testing import CliRunner

            from phoenix_hpc.cli.main import cli

            r = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
            assert r.exit_code == 0, r.output
            stdout = r.stdout
        self.job_id = json.loads(stdout)["job_id"]
        self.client = SlurmClient(env=env)
        self.t0 = time.monotonic()

    def events(self, name: str | None = None) -> list[dict]:
        if not (self.run_dir / "journal.jsonl").exists():
            return []
        return read_journal(self.run_dir, name)

    def step(self, logical: int) -> int:
        p = self.run_dir / "ranks" / f"rank{logical}.steps.jsonl"
        try:
            return max((json.loads(line)["step"] for line in p.read_text().splitlines() if line.strip()), default=0)
        except (OSError, ValueError):
            return 0

    def node_of(self, world_rank: int) -> str:
        reg = _wait(lambda: [e for e in self.events("registered") if e["world_rank"] == world_rank], 120,
                    f"registration of world rank {world_rank}")
        return reg[0]["node"]

    def wait_end(self, timeout_s: float = 150.0) -> dict:
        """Wait for the coordinator to exit and the Slurm job to end; return ``job_done``."""
        _wait(lambda: self.events("coordinator_exit"), timeout_s, f"the end of job {self.job_id} "
              f"(journal: {[e['event'] for e in self.events()][-6:]})", poll_s=0.3)
        def ended() -> str | None:
            state = self.client.show_job(self.job_id).get("JobState")
            return state if state not in (None, "RUNNING", "COMPLETING", "PENDING") else None

        self.slurm_state = _wait(ended, 60, f"Slurm job {self.job_id} to leave RUNNING", poll_s=0.5)
        self.elapsed_s = time.monotonic() - self.t0
        done = self.events("job_done")
        assert done, f"no job_done; journal tail: {self.events()[-8:]}; output: {self.output()[-3000:]}"
        return done[0]

    def output(self) -> str:
        p = self.run_dir / f"slurm-{self.job_id}.out"
        return p.read_text() if p.exists() else ""

    def cancel(self) -> None:
        self.client.cancel(self.job_id)


def _run_reference(env, data, tmp, name, config=None) -> dict:
    """Run a job without faults to its end; its ``job_done`` record (the oracle's reference hash). It runs
    without spares: the final state is a function of the training configuration alone, so the runs with faults
    (spares taking ranks over) must end as a job that never had any, and it starts faster."""
    cfg = config or CONFIG
    job = Job(env, tmp, data, name, dict(cfg, resources=dict(cfg["resources"], spares=0)))
    try:
        done = job.wait_end()
    finally:
        job.cancel()
    assert done["step"] == (config or CONFIG)["training"]["steps"] and done["steps_agree"]
    assert not job.events("fault") and not job.events("recovery_start") and not job.events("slots_dead")
    # the ranks registered, heartbeat and finished through the coordinator: every slot active, nothing of
    # theirs rejected, and the final hash is SHA-256 over the ranks' state hashes in logical-rank order
    p = cfg["parallelism"]
    world = p.get("tp", 1) * p.get("pp", 1) * p["dp"]
    assert sorted((e["world_rank"], e["role"]) for e in job.events("registered")) == [
        (w, "active") for w in range(world)]
    assert not job.events("rejected"), job.events("rejected")
    hashes = [json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text())["state_hash"] for r in range(world)]
    assert done["rank_hashes"] == hashes
    assert done["final_hash"] == hashlib.sha256("".join(hashes).encode()).hexdigest()
    print(f"fault-free {name}: {job.elapsed_s:.1f} s, final hash {done['final_hash'][:16]}")
    return done


def _check_recovery(job: Job, done: dict, reference: dict, action: str = "hot_swap") -> dict:
    _assert_fault_free_end(job, done, reference)
    (rec,) = job.events("recovery_done")
    assert rec["action"] == action and rec["steps_replayed"] <= 1
    assert set(rec["phases"]) == PHASES and all(v >= 0 for v in rec["phases"].values())
    assert not job.events("invariant_violation")
    # the checks ran on evidence (docs/design.md section 6) and none of it was rejected
    assert not job.events("evidence_rejected"), job.events("evidence_rejected")
    print(f"{action}: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s {rec['phases']}, "
          f"R={rec['recoverable_step']}, replayed {rec['steps_replayed']}")
    return rec


def _assert_fault_free_end(job, done, reference):
    """The job ended with the fault-free final state at the last step, every rank agreeing, and Slurm says it
    COMPLETED (afterok chains, sacct), although lost slots exited non-zero."""
    assert done["final_hash"] == reference["final_hash"], (
        f"final hash {done['final_hash'][:16]} != fault-free {reference['final_hash'][:16]}; "
        f"rank hashes {done['rank_hashes']} vs {reference['rank_hashes']}")
    assert done["step"] == STEPS and done["steps_agree"]
    assert job.slurm_state == "COMPLETED", (job.slurm_state, job.output()[-1500:])


class TransportWedgedRerun(UserWarning):
    """A node-loss job was run once more because its survivor hit Open MPI 4.1's TCP deadlock (shown in the
    run's warnings summary, and recorded as the test's ``rerun`` property)."""


def _wedged_survivor_fallback(job: Job, victim_world_rank: int) -> str | None:
    """What the journal says when the only failure of the job was Open MPI 4.1's TCP deadlock on the dead
    peer's connection (README, Limits; docs/design.md section 12), with its documented outcome: a survivor
    (not the victim) reported ``TransportWedged`` and left, and with dp = 2 both shards were then gone, so the
    job ended in the checkpoint fallback (``fallback``, no ``job_done``) with no invariant broken. None if
    anything else happened (no such fault, another end, an invariant violation): that is a failure."""
    wedged = [f for f in job.events("fault")
              if f.get("exc_type") == "TransportWedged" and f.get("world_rank") != victim_world_rank]
    if not wedged or job.events("job_done") or job.events("invariant_violation"):
        return None
    ends = job.events("fallback")
    if len(ends) != 1:
        return None
    fb = ends[0]
    return (f"world rank {wedged[0]['world_rank']} left with TransportWedged at step {wedged[0].get('step')}; "
            f"the job ended in the fallback ({fb.get('reason')})")


def _kill_node_at_step_10(env, data, slurm_cluster, tmp_path, name: str,
                          config: dict) -> tuple[Job, dict | None, str, int, str | None]:
    """Kill the node of logical rank 1 after its step 10 and wait for the end. Returns the job, its
    ``job_done`` (None when the job ended as :func:`_wedged_survivor_fallback` describes, whose description is
    the last item), the killed node and the step of the kill. Any other failure raises."""
    job = Job(env, tmp_path, data, name, config)
    wedged = None
    victim = None
    try:
        victim = job.node_of(1)
        targets = lc.node_kill_targets(slurm_cluster, victim)  # the /proc scan before the wait: the kill follows it
        _wait(lambda: job.step(1) >= 10, 120, "step 10 on logical rank 1", poll_s=0.01)
        # read before the kill: the spare appends to the same log once it holds logical rank 1
        killed_at = job.step(1)
        lc.kill_node(slurm_cluster, victim, mark_down_reason="hot-swap test: node loss", targets=targets)
        assert killed_at < STEPS, "logical rank 1 finished its steps before the kill: no fault was tested"
        try:
            done = job.wait_end()
        except AssertionError:
            wedged = _wedged_survivor_fallback(job, victim_world_rank=1)
            if wedged is None:
                raise
            done = None
    finally:
        job.cancel()
        if victim and not procs.is_alive(slurm_cluster.daemons[f"slurmd:{victim}"]):
            lc.revive_node(slurm_cluster, victim)
    return job, done, victim, killed_at, wedged


@pytest.mark.parametrize("path", PATHS)
def test_node_loss_is_hot_swapped_to_the_spare_with_identical_final_hash(env, data, reference, slurm_cluster,
                                                                         tmp_path, path, record_property):
    """The node of logical rank 1 is killed right after its step 10; the spare takes the rank from memory. A
    run whose only failure is that the survivor hit Open MPI 4.1's TCP deadlock on the dead peer's connection
    (a documented limit of that library, not of the hot swap: the survivor leaves, and with dp = 2 both shards
    are gone, so the job ends in the fallback; :func:`_wedged_survivor_fallback`) is run once more, and the
    rerun is reported in the run's summary (warning :class:`TransportWedgedRerun`, property ``rerun``); a
    second such run, or any other failure, fails."""
    cfg = with_path(CONFIG, path)
    job, done, victim, killed_at, wedged = _kill_node_at_step_10(env, data, slurm_cluster, tmp_path,
                                                                 f"node-loss-{path}", cfg)
    if done is None:
        why = f"node-loss-{path} run again: {wedged}"
        record_property("rerun", why)
        warnings.warn(TransportWedgedRerun(why))
        job, done, victim, killed_at, wedged = _kill_node_at_step_10(env, data, slurm_cluster, tmp_path,
                                                                     f"node-loss-{path}-again", cfg)
        assert done is not None, f"the survivor deadlocked in Open MPI in two runs in a row: {wedged}"
    rec = _check_recovery(job, done, reference)
    dead = job.events("slots_dead")
    assert dead and dead[0]["slots"] == [1] and dead[0]["nodes"] == [victim]
    (plan,) = job.events("recovery_plan")
    (join,) = plan["joins"]
    assert join["world_rank"] == 2 and join["logical_rank"] == 1 and join["node"] != victim
    assert {t["kind"] for t in plan["transfers"]} == {"params", "optimizer"}
    spare = json.loads((job.run_dir / "ranks" / "rank1.json").read_text())
    assert spare["world_rank"] == 2 and spare["joined"] and spare["generation"] == 1
    assert spare["state_hash"] == reference["rank_hashes"][1]
    # memory holds the state of the moment the node died: never older than when the kill began (the kill
    # itself takes a moment of Slurm commands, while the job runs on), and at most one step is replayed
    assert rec["recoverable_step"] >= killed_at - 2 and rec["steps_replayed"] <= 1
    check_path(job, CONFIG, path)
    # replica agreement (docs/design.md section 6): the DP peers' parameter digests, the spare's after the hot
    # swap included, never differed (how many steps were compared depends on when the heartbeats carried them:
    # not asserted); only the old generation's reports were refused
    checks = [c["agreement"] for c in job.events("commit") if c.get("agreement")]
    assert all(a["disagreed"] == 0 for a in checks), checks
    assert not job.events("silent_corruption") and not job.events("agreement_undetectable")
    assert all("of generation 0, the job is at generation 1" in r["reason"] for r in job.events("agreement_rejected"))


AT_STEP = 20


def _inject(job: Job, kind: str, phase: str, at_step: int = AT_STEP, rank: int = 1, wait: bool = True) -> dict:
    """``phoenix inject-fault`` on logical rank ``rank``, as soon as every active rank registered.

    The command runs in this process (click's runner, the job's environment): the same code as the
    executable without a fresh interpreter's start, while this small job runs several steps a second.
    (The executable itself is checked in tests/e2e/test_inject_status.py.)"""
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    _wait(lambda: job.events("job_running"), 120, "job_running")
    r = CliRunner().invoke(cli, ["inject-fault", str(job.run_dir), "--kind", kind, "--rank", str(rank),
                                 "--at-step", str(at_step), "--phase", phase, "--json",
                                 "--wait" if wait else "--no-wait"], env=job.env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _fired(job: Job) -> list[dict]:
    from phoenix_hpc.faults.trigger import read_fired

    return read_fired(job.run_dir)


def _run_injected(env, data, tmp_path, name: str, kind: str, phase: str, config: dict | None = None):
    job = Job(env, tmp_path, data, name, config)
    try:
        _inject(job, kind, phase)
        done = job.wait_end()
    finally:
        job.cancel()
    (fired,) = _fired(job)
    assert (fired["world_rank"], fired["step"], fired["kind"]) == (1, AT_STEP, {"kill-node": "node_loss"}.get(kind, kind.replace("-", "_")))
    return job, done


SECOND_AT = 32  # the step of the second fault of a two-fault job
WIRE_PHASE = {"forward": "forward_backward", "optimizer": "optimizer_step"}


# Every phase on rebind, two phases per job: logical rank 1 crashes at AT_STEP in the first, logical rank 0
# (armed at the start, so it lands after the first recovery) at SECOND_AT in the second; one spare per crash.
# Rebuild once, in H2H (a survivor mid-replication when its peer dies): rebuild in the other phases is the same
# scenario on the same path, whose checks are those of the rebind job of that phase plus check_path(rebuild),
# which the h2h job makes. The rebuild job's second fault is a transient error (a local recovery without the
# spare, on the rebuild path; on rebind it is the job of test_transient_error_in_h2h_releases_the_peer_waiting_
# for_its_ack). Node loss runs on both paths.
@pytest.mark.parametrize("faults,path", [((("crash", "forward"), ("crash", "d2h")), "rebind"),
                                         ((("crash", "h2h"), ("crash", "optimizer")), "rebind"),
                                         ((("crash", "h2h"), ("transient", "forward")), "rebuild")],
                         ids=["forward+d2h-rebind", "h2h+optimizer-rebind", "h2h+transient-rebuild"])
def test_process_crash_in_each_phase_is_hot_swapped_with_identical_final_hash(env, data, reference, tmp_path, faults,
                                                                               path):
    crashes = [i for i, (kind, _) in enumerate(faults) if kind == "crash"]
    cfg = with_path(dict(CONFIG, resources=dict(CONFIG["resources"], spares=len(crashes))), path)
    job = Job(env, tmp_path, data, f"faults-{'-'.join(k + '-' + ph for k, ph in faults)}-{path}", cfg)
    at = [AT_STEP, SECOND_AT][:len(faults)]
    victims = [1, 0][:len(faults)]  # logical ranks; generation-0 world rank == logical rank
    try:
        for (kind, phase), step, rank in zip(faults, at, victims):
            _inject(job, kind, phase, at_step=step, rank=rank, wait=False)
        done = job.wait_end()
    finally:
        job.cancel()
    _assert_fault_free_end(job, done, reference)
    fired = sorted(_fired(job), key=lambda f: f["step"])
    assert [(f["world_rank"], f["step"], f["kind"], f["phase"]) for f in fired] == [
        (r, a, kind, WIRE_PHASE.get(ph, ph)) for (kind, ph), a, r in zip(faults, at, victims)], fired
    assert [d["slots"] for d in job.events("slots_dead")] == [[victims[i]] for i in crashes]
    recs = job.events("recovery_done")
    assert [r["generation"] for r in recs] == list(range(1, len(faults) + 1)), recs
    plans = job.events("recovery_plan")
    assert len(plans) == len(faults), plans
    for (kind, _), rec, plan, a in zip(faults, recs, plans, at):
        assert rec["steps_replayed"] <= 1
        assert set(rec["phases"]) == PHASES and all(v >= 0 for v in rec["phases"].values())
        if kind == "crash":
            assert rec["action"] == "hot_swap" and len(plan["joins"]) == 1, (rec, plan)
            # the crash in iteration a loses at most the copy of S(a-1): the recoverable step is a-2 or a-1
            assert rec["recoverable_step"] in (a - 2, a - 1), (rec, a)
        else:  # a local recovery: no slot dead, no spare joined, nothing transferred
            assert rec["action"] == "local_recovery" and plan["joins"] == [] and plan["transfers"] == [], (rec, plan)
        print(f"{kind}: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s {rec['phases']}, "
              f"R={rec['recoverable_step']}, replayed {rec['steps_replayed']}")
    assert not job.events("invariant_violation")
    assert not job.events("evidence_rejected"), job.events("evidence_rejected")
    world_of = {0: 0, 1: 1}  # logical -> world rank at the end: the spares, 2, 3, ... in the order of the crashes
    for n, i in enumerate(crashes):
        world_of[victims[i]] = 2 + n
    ranks = [json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["world_rank"], r["joined"], r["generation"]) for r in ranks] == [
        (world_of[r], world_of[r] >= 2, len(faults)) for r in (0, 1)], ranks
    check_path(job, CONFIG, path)


def test_hang_and_link_down_are_detected_by_heartbeat_timeout_and_hot_swapped(env, data, reference, tmp_path):
    """One job, two spares, two faults found only by the heartbeat timeout, each hot swapped:

    - a hang (SIGSTOP) of logical rank 1 in forward at step AT_STEP. The stopped slot never exits by itself:
      the batch script ends the srun step once the coordinator is gone (after its grace period), so the
      allocation is released without outside help;
    - a link-down of logical rank 0 in forward at step SECOND_AT (armed at the start, it lands after the
      first recovery): the slot stops talking (heartbeats stop, its thread blocks, its process and
      connections stay).

    The final state is the fault-free one. (Two faults in one job: the step grace for the slots that never
    exit is waited for once.)"""
    cfg = dict(CONFIG, resources=dict(CONFIG["resources"], spares=2))
    job = Job(env, tmp_path, data, "hang-link-down", cfg)
    try:
        _inject(job, "hang", "forward", wait=False)
        _inject(job, "link-down", "forward", at_step=SECOND_AT, rank=0, wait=False)
        done = job.wait_end()
    finally:
        job.cancel()
    _assert_fault_free_end(job, done, reference)
    fired = sorted(_fired(job), key=lambda f: f["step"])
    assert [(f["world_rank"], f["step"], f["kind"], f["phase"]) for f in fired] == [
        (1, AT_STEP, "hang", "forward_backward"), (0, SECOND_AT, "link_down", "forward_backward")], fired
    recs = job.events("recovery_done")
    assert [r["generation"] for r in recs] == [1, 2], recs
    for rec in recs:
        assert rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1
        assert set(rec["phases"]) == PHASES and all(v >= 0 for v in rec["phases"].values())
    assert not job.events("invariant_violation")
    dead = job.events("slots_dead")
    assert [(d["slots"], d["kind"]) for d in dead] == [([1], "heartbeat_timeout"), ([0], "heartbeat_timeout")]
    spares = [json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (1, 0)]
    assert [(s["world_rank"], s["joined"]) for s in spares] == [(2, True), (3, True)], spares
    assert "ending the step" in job.output()
    assert not _pid_alive(int(fired[0]["pid"])), "the stopped slot outlived its job"
    print(f"hang + link-down: job {job.elapsed_s:.1f} s, recoveries "
          + "; ".join(f"{r['total_s']} s {r['phases']}" for r in recs))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _check_local_recovery(job: Job, path: str) -> None:
    """A local recovery: no slot dead, no spare joined, nothing transferred, every member on ``path``."""
    assert not job.events("slots_dead")
    (plan,) = job.events("recovery_plan")
    assert plan["joins"] == [] and plan["transfers"] == []
    ranks = [json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_rank"] for r in ranks] == [0, 1] and all(r["generation"] == 1 for r in ranks)
    assert not (job.run_dir / "ranks" / "rank2.json").exists()
    check_path(job, CONFIG, path)


def test_crash_during_a_recovery_is_queued_and_hot_swapped(env, data, reference, tmp_path):
    """A transient error on rank 1 starts a local recovery; rank 0 crashes inside it (phase ``recovery``).
    The coordinator aborts that recovery and runs a hot swap of rank 0 onto the spare; rank 1 answers the
    second quiesce too. The final hash is still the fault-free one."""
    job = Job(env, tmp_path, data, "during-recovery")
    try:
        _inject(job, "crash", "recovery", rank=0, wait=False)  # armed until the first recovery at or after AT_STEP
        _inject(job, "transient", "forward")
        done = job.wait_end()
    finally:
        job.cancel()
    assert done["final_hash"] == reference["final_hash"] and done["step"] == STEPS
    starts = job.events("recovery_start")
    assert [s["action"] for s in starts] == ["local_recovery", "hot_swap"]
    assert [a["generation"] for a in job.events("recovery_aborted")] == [1]
    (rec,) = job.events("recovery_done")
    assert rec["generation"] == 2 and rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1
    assert set(rec["phases"]) == PHASES
    assert sorted((f["world_rank"], f["phase"]) for f in _fired(job)) == [(0, "recovery"), (1, "forward_backward")]
    spare = json.loads((job.run_dir / "ranks" / "rank0.json").read_text())
    assert spare["world_rank"] == 2 and spare["joined"] and spare["generation"] == 2
    print(f"fault during recovery: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s {rec['phases']}")


def test_gpu_error_fences_the_slot_and_hot_swaps_it(env, data, reference, tmp_path):
    """An uncorrectable-memory error (Xid 48 signature) raised in the optimizer step of a live slot: the
    coordinator classifies it for replacement, fences the slot (declared dead although its process lives)
    and hot swaps it onto the spare; the final state is the fault-free one."""
    job, done = _run_injected(env, data, tmp_path, "gpu-error", "gpu-error", "optimizer")
    _check_recovery(job, done, reference)
    (dead,) = job.events("slots_dead")
    assert dead["slots"] == [1] and dead["kind"] == "gpu_memory"
    (dec,) = job.events("decision")
    assert dec["action"] == "hot_swap"
    spare = json.loads((job.run_dir / "ranks" / "rank1.json").read_text())
    assert spare["world_rank"] == 2 and spare["joined"]
    # the fenced slot was told to stop when declared dead; its summary never takes the spare's file
    fenced = json.loads((job.run_dir / "ranks" / "fenced-world1.json").read_text())
    assert fenced["status"] == "fenced" and fenced["world_rank"] == 1
    assert "declared dead (gpu_memory" in fenced["error"]


PAUSE_S = 6.0  # longer than the heartbeat timeout (4 s) the coordinator applies to slots


def _pause_coordinator(job: Job, seconds: float) -> tuple[int, int]:
    """SIGSTOP the job's coordinator (its pid from ``coordinator.json``) for ``seconds``, then SIGCONT it.
    Returns logical rank 0's step when it stopped and when it continued."""
    import signal

    pid = int(json.loads((job.run_dir / "coordinator.json").read_text())["pid"])
    before = job.step(0)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
        after = job.step(0)
    finally:
        os.kill(pid, signal.SIGCONT)
    return before, after


def test_transient_error_in_h2h_releases_the_peer_waiting_for_its_ack(env, data, reference, tmp_path):
    """A transient error in rank 1's H2H send: rank 0 waits in wait_commit for an acknowledgement that will
    not come. The coordinator's quiesce ends that wait (it does not run into the commit timeout), and the
    local recovery (on the rebind path: no slot dead, no spare joined, nothing transferred) ends in the
    fault-free state.

    After the recovery the coordinator is paused (SIGSTOP) for longer than the heartbeat timeout and then
    continued: a busy coordinator is not a dead one. No rank exits, the ranks train on while it is stopped,
    it counts none of them dead for the silence it did not hear (journal ``coordinator_paused``), and the
    job ends in the fault-free state."""
    job = Job(env, tmp_path, data, "transient-h2h")
    try:
        _inject(job, "transient", "h2h")
        _wait(lambda: job.events("recovery_done"), 120, "recovery_done", poll_s=0.05)
        before, after = _pause_coordinator(job, PAUSE_S)
        done = job.wait_end()
    finally:
        job.cancel()
    (fired,) = _fired(job)
    assert (fired["world_rank"], fired["step"], fired["kind"]) == (1, AT_STEP, "transient")
    _check_recovery(job, done, reference, action="local_recovery")  # one recovery: nobody dead after the pause
    timeouts = [f for f in job.events("fault") if "timed out" in str(f.get("message", ""))]
    assert not timeouts, timeouts
    assert before < STEPS and after > before, f"no step while the coordinator was stopped ({before} -> {after})"
    _check_local_recovery(job, "rebind")
    (paused,) = [e for e in job.events("coordinator_paused") if e["paused_s"] >= PAUSE_S - 1]
    ranks = [json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["status"] for r in ranks] == ["done", "done"]
    assert "coordinator lost" not in job.output()
    print(f"coordinator stopped {PAUSE_S:g} s after the recovery: rank 0 trained steps {before} -> {after} "
          f"meanwhile; journal coordinator_paused {paused['paused_s']} s; job {job.elapsed_s:.1f} s")


def _cli(job: Job, *args: str):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    return CliRunner().invoke(cli, list(args), env=job.env, catch_exceptions=False)


def test_planned_drain_moves_the_node_to_the_spare_replaying_no_step(env, data, reference, tmp_path):
    """``phoenix drain --node`` of an active node: every member pauses at one commit fence, the drained slot
    leaves and the spare takes its logical rank with 0 steps replayed; the final state is bitwise the
    fault-free run's. Then a drain with no spare left (shrink is not available; or, if this fast job ended
    meanwhile, a finished job) and a drain of the finished job are refused with exit code 2. (The refusals
    of a node of spares only and of unknown targets are unit tests: this job trains 40 steps in seconds.)"""
    job = Job(env, tmp_path, data, "drain")
    try:
        _wait(lambda: job.events("job_running"), 120, "job_running")
        victim = job.node_of(1)
        # at once: this job trains its 40 steps in about 2 s once its engines are built (10 s or more here);
        # the slots arm the drain while they build, for the fence of iteration 2 (newest step 0 + 2)
        r = _cli(job, "drain", str(job.run_dir), "--node", victim, "--json")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["state"] == "done" and out["steps_replayed"] == 0 and out["moved"] == [[1, 2, 1]], out
        r = _cli(job, "drain", str(job.run_dir), "--rank", "0")  # the spare is used: none left
        assert r.exit_code == 2 and ("the drain needs a spare, or --shrink" in r.output
                                     or "nothing to drain" in r.output), r.output
        done = job.wait_end()
    finally:
        job.cancel()
    assert done["final_hash"] == reference["final_hash"], (done["rank_hashes"], reference["rank_hashes"])
    assert done["step"] == STEPS and done["steps_agree"]
    assert job.slurm_state == "COMPLETED", (job.slurm_state, job.output()[-1500:])  # the drained slot exited 0
    assert not job.events("fault") and not job.events("slots_dead") and not job.events("invariant_violation")
    (rec,) = job.events("recovery_done")
    assert rec["steps_replayed"] == 0 and rec["drain"] == out["request_id"]
    (d,) = job.events("drain_done")
    assert d["steps_replayed"] == 0 and d["recoverable_step"] == out["at_step"] - 1
    spare = json.loads((job.run_dir / "ranks" / "rank1.json").read_text())
    assert spare["world_rank"] == 2 and spare["joined"] and spare["state_hash"] == reference["rank_hashes"][1]
    # the drained slot's own summary, apart: it may leave after the spare has finished
    drained = json.loads((job.run_dir / "ranks" / "drained-world1.json").read_text())
    assert drained["status"] == "drained" and drained["rank"] == 1 and drained["world_rank"] == 1
    st = _cli(job, "status", str(job.run_dir), "--json")
    drains = json.loads(st.stdout)["drains"]
    assert [(x["state"], x["steps_replayed"]) for x in drains] == [("done", 0)]
    r = _cli(job, "drain", str(job.run_dir), "--rank", "1")
    assert r.exit_code == 2 and "nothing to drain" in r.output, r.output
    print(f"drain: job {job.elapsed_s:.1f} s, at iteration {out['at_step']}, recovery {rec['total_s']} s "
          f"{rec['phases']}, replayed {rec['steps_replayed']}")


def test_killed_coordinator_is_restarted_and_the_job_finishes_identical(env, data, reference, tmp_path):
    """SIGKILL of the coordinator mid-run: the batch script's supervisor starts a new one, which rebuilds the
    job from the journal; the ranks train on meanwhile (no rank exits, nothing is printed as a traceback),
    rejoin it, and the job ends in the same allocation with the fault-free final hash."""
    import signal

    job = Job(env, tmp_path, data, "coordinator-kill")
    try:
        _wait(lambda: job.step(0) >= 5, 120, "step 5 on logical rank 0", poll_s=0.05)
        pid = int(json.loads((job.run_dir / "coordinator.json").read_text())["pid"])
        killed_at = job.step(0)
        os.kill(pid, signal.SIGKILL)
        done = job.wait_end(timeout_s=240)
    finally:
        job.cancel()
    assert killed_at < STEPS
    assert done["final_hash"] == reference["final_hash"] and done["step"] == STEPS and done["steps_agree"]
    assert job.slurm_state == "COMPLETED", (job.slurm_state, job.output()[-1500:])
    starts = job.events("coordinator_started")
    assert [s.get("restart") for s in starts] == [None, 1] and starts[1]["pid"] != pid
    (rebuilt,) = job.events("coordinator_restarted")
    assert rebuilt["job_state"] == "running" and rebuilt["generation"] == 0 and rebuilt["dead"] == []
    # the spare registered in standby and, never needed, was told to stop at the end (the job COMPLETED: every
    # slot exited 0); the ranks' registration and the final hash of a fault-free job: _run_reference
    assert sorted((e["world_rank"], e["role"]) for e in job.events("registered")) == [
        (0, "active"), (1, "active"), (2, "standby")]
    rejoined = {e["world_rank"]: e for e in job.events("rejoined")}
    assert sorted(rejoined) == [0, 1, 2], rejoined
    assert not job.events("slots_dead") and not job.events("recovery_start")
    ranks = [json.loads((job.run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["status"] for r in ranks] == ["done", "done"]
    out = job.output()
    assert "Traceback" not in out and "coordinator lost" not in out, out[-3000:]
    log = (job.run_dir / "logs" / "coordinator.log").read_text()
    assert "restart 1 of 3" in log, log[-2000:]
    print(f"coordinator killed at step {killed_at}: rejoined at steps "
          f"{[rejoined[w]['step'] for w in (0, 1)]}, job {job.elapsed_s:.1f} s")


def test_coordinator_killed_during_a_hot_swap_is_restarted_and_the_swap_ends_identical(env, data, reference,
                                                                                       tmp_path):
    """Logical rank 1 crashes at step AT_STEP; the coordinator starts the hot swap (``recovery_start``, the
    survivor quiesced) and is SIGKILLed inside it: the test-only hold ``PHOENIX_TEST_HOLD_AFTER``
    (control/hold.py) keeps it there until the kill. The restarted coordinator reads the recovery in progress
    from the journal, the survivor and the spare rejoin, the hot swap runs again as generation 2, and the job
    ends in the same allocation with the fault-free final hash."""
    import signal

    job = Job(dict(env, PHOENIX_TEST_HOLD_AFTER="recovery_start:60"), tmp_path, data, "coordinator-kill-swap")
    try:
        _inject(job, "crash", "forward", wait=False)
        _wait(lambda: job.events("test_hold"), 180, "the coordinator inside the hot swap", poll_s=0.05)
        pid = int(json.loads((job.run_dir / "coordinator.json").read_text())["pid"])
        os.kill(pid, signal.SIGKILL)
        done = job.wait_end(timeout_s=240)
    finally:
        job.cancel()
    _assert_fault_free_end(job, done, reference)
    starts = job.events("coordinator_started")
    assert [s.get("restart") for s in starts] == [None, 1] and starts[1]["pid"] != pid
    (rebuilt,) = job.events("coordinator_restarted")
    assert rebuilt["recovery_interrupted"] and rebuilt["generation"] == 1 and rebuilt["dead"] == [1], rebuilt
    assert [e["generation"] for e in job.events("recovery_start")] == [1, 2]
    (rec,) = job.events("recovery_done")
    assert rec["generation"] == 2 and rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1, rec
    assert not job.events("invariant_violation")
    spare = json.loads((job.run_dir / "ranks" / "rank1.json").read_text())
    assert spare["world_rank"] == 2 and spare["joined"] and spare["state_hash"] == reference["rank_hashes"][1]
    out = job.output()
    assert "Traceback" not in out and "coordinator lost" not in out, out[-3000:]
    print(f"coordinator killed in the hot swap: restarted, recovery {rec['total_s']} s {rec['phases']}, "
          f"job {job.elapsed_s:.1f} s")


def test_protection_that_does_not_fit_runs_every_mth_step_and_a_crash_replays_at_most_2m_minus_1(env, data, reference,
                                                                                                  tmp_path):
    """A replication path too slow for one step's compute window (the documented test-only knob
    ``PHOENIX_TEST_REPLICATION_DELAY_S``, runtime/protector.py, delays every replica by 0.3 s; this job's steps
    take about 50 ms) with ``protect_every_max: 4``: the ranks choose m > 1 from their measurements (journal
    ``protect_interval``, ``phoenix status``), a crash of logical rank 1 at step AT_STEP is hot swapped replaying
    at most 2 x cap - 1 steps, and the job ends bitwise identical to the fault-free run (protection only reads the
    state, so the reference of :data:`CONFIG` serves)."""
    cfg = dict(CONFIG, resilience=dict(CONFIG["resilience"], protect_every_max=4))
    job = Job(dict(env, PHOENIX_TEST_REPLICATION_DELAY_S="0.3"), tmp_path, data, "adaptive-interval", cfg)
    try:
        _inject(job, "crash", "forward", wait=False)
        done = job.wait_end(timeout_s=200)
    finally:
        job.cancel()
    _assert_fault_free_end(job, done, reference)
    chosen = job.events("protect_interval")
    gen0 = [e["interval"] for e in chosen if e["generation"] == 0]
    assert gen0 and max(gen0) > 1 and all(1 <= m <= 4 for m in gen0), chosen
    (rec,) = job.events("recovery_done")
    m = [e["interval"] for e in chosen if e["generation"] == 0 and (e["step"] or 0) < AT_STEP][-1]
    # the journal names the interval of committed snapshots; the one in flight at the fault may be larger
    # (m + m' - 1 for consecutive intervals m, m'), so the bound is that of the cap: 2 x 4 - 1
    assert rec["action"] == "hot_swap" and 0 <= rec["steps_replayed"] <= 2 * 4 - 1, (rec, chosen)
    assert not job.events("invariant_violation") and not job.events("evidence_rejected")
    st = json.loads(_cli(job, "status", str(job.run_dir), "--json").stdout)
    assert st["job"]["protect_every"] == chosen[-1]["interval"], (st["job"], chosen[-1])
    print(f"adaptive interval: m chosen {[(e['generation'], e['step'], e['interval']) for e in chosen]}; crash at "
          f"{AT_STEP} with m={m}: R={rec['recoverable_step']}, replayed {rec['steps_replayed']}, recovery "
          f"{rec['total_s']} s; job {job.elapsed_s:.1f} s")
