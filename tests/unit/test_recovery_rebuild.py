"""The rebuild recovery path of :class:`phoenix_hpc.launch.execute.Member`, in one process, with a fake
engine that keeps module-level global state the way megatron-core's ``parallel_state`` does.

The fake engine owns its groups (the launcher builds only the world group), refuses to be constructed while
the global state of an earlier generation is still set (``model_parallel_is_initialized()`` must be false),
and its :meth:`teardown` clears that state and overwrites its tensors (as freed device memory would be), so a
survivor that read its state after teardown, or kept a view into the old engine, loads garbage and the test
fails. The real pieces run: :meth:`Member.recover` (its :class:`~phoenix_hpc.launch.rank_recovery.RankRecovery`),
``_setup_groups`` (with ``init_generation`` and ``make_comm`` replaced by recorders, since there is no process
group or MPI here), the host copy, teardown, construction and loading. The protector is a stand-in holding committed snapshots.

The torch engine's own rebuild (teardown, new engine, load, continue bitwise) is in test_engine_torch.py.
"""

from __future__ import annotations

import threading
import time

import weakref
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from phoenix_hpc.runtime.checksum import DEFAULT_CHECKSUM
from phoenix_hpc.engines.base import Engine, ProcessGroups
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.faults.trigger import InjectedCommError
from phoenix_hpc.launch.groups import Grid
from phoenix_hpc.launch import execute, transfers
from phoenix_hpc.launch.execute import Member, MemberEnv
from phoenix_hpc.launch.rank_recovery import Phase
from phoenix_hpc.recovery.plan import RecoveryPlan

#: the fake engine's "parallel_state": set by construction, cleared by teardown
PARALLEL_STATE: dict = {}
EVENTS: list[tuple] = []


class FakeGlobalEngine(Engine):
    """One rank's engine of a single-rank grid: a parameter, an optimizer shard, a step counter."""

    recovery_style = "rebuild"
    supported_recovery_styles = ("rebuild",)
    owns_groups = True

    def __init__(self, cfg, coord, groups: ProcessGroups, device):
        if PARALLEL_STATE:
            raise AssertionError(f"parallel state of generation {PARALLEL_STATE['generation']} still initialised")
        assert groups.dp is None and groups.pp is None and groups.tp is None, "the launcher built sub-groups"
        g = groups.generation
        self.groups = ProcessGroups(groups.world, ("dp", g), ("pp", g), ("tp", g), g)
        PARALLEL_STATE.update(generation=g, groups=self.groups)
        EVENTS.append(("construct", g))
        self.coord, self.step = coord, 0
        self.param = torch.zeros(4)
        self.opt = torch.zeros(4)
        self.rng = 0

    def forward_backward(self):
        return 0.0

    def reduce_gradients(self):
        pass

    def optimizer_step(self):
        self.step += 1
        self.param += 1.0
        self.opt += 0.5
        self.rng += 7

    def optimizer_shard(self):
        return [("opt/pp0/tp0/dp0/w/main", self.opt)]

    def param_shard(self):
        return [("param/pp0/tp0/w", self.param)]

    def envelope(self):
        return {"step": self.step, "rng": self.rng}

    def load_optimizer_shard(self, tensors):
        self.opt.copy_(tensors["opt/pp0/tp0/dp0/w/main"])
        EVENTS.append(("load", self.groups.generation))

    def load_param_shard(self, tensors):
        self.param.copy_(tensors["param/pp0/tp0/w"])

    def load_envelope(self, envelope):
        self.step, self.rng = int(envelope["step"]), int(envelope["rng"])

    def rebind(self, groups, coord):
        raise AssertionError("an engine with global state is never rebound")

    def release_groups(self):
        EVENTS.append(("release", self.groups.generation if self.groups else None))

    def teardown(self):
        EVENTS.append(("teardown", self.groups.generation if self.groups else None))
        self.param.fill_(float("nan"))  # what is left of freed memory
        self.opt.fill_(float("nan"))
        self.groups = None
        PARALLEL_STATE.clear()


class FakeProtector:
    """Committed local snapshots by step (host copies), as :meth:`Protector.local_snapshot` returns them."""

    shard_id = "opt/pp0/tp0/dp0"
    holders: tuple[int, ...] = ()
    generation = 0
    recoverable_step = None  # the newest commit fence's step (None: this generation had none yet)
    create_s: dict = {}  # seconds per part of Protector.create (none here)
    wedged = False  # close(abandon=True) found the H2H thread stuck inside MPI
    abandon_report = None

    def __init__(self, snapshots: dict[int, tuple[torch.Tensor, torch.Tensor, dict]]):
        self.snapshots = snapshots

    def close(self, abandon=False, dead_peers=frozenset()):
        self.closed_with = (abandon, dead_peers)

    def copy_steps(self):
        return sorted(self.snapshots), {}

    def reverify_held(self):
        return [], []

    def local_snapshot(self, step, copy=True):
        opt, par, env = self.snapshots[step]
        return SimpleNamespace(tensors={"opt/pp0/tp0/dp0/w/main": opt.clone(), "param/pp0/tp0/w": par.clone()},
                               envelope=dict(env), step=step)


class FakeClient:
    def __init__(self):
        self.instructions: deque = deque()
        self.injections: list = []
        self.injections_lock = threading.Lock()  # as control/client.py: shared with the FaultTrigger
        self.sent: list[tuple] = []

    def stop_heartbeat(self):
        pass

    def report_quiesced(self, g, live, shards, replicas, dirty, rejected=None, numel=None):
        self.sent.append(("quiesced", g, live, dirty))
        self.offered = dict(shards)

    def report_recovered(self, g, report, timings):
        self.sent.append(("recovered", g, report["step"], dict(timings)))

    def wait_instruction(self, types, timeout_s):
        raise AssertionError(f"waited for {types} with nothing queued")

    def poll(self):
        return []

    poll_if_rung = poll  # no doorbell: every call polls

class FakeStore:
    def __init__(self):
        self.counters: dict[str, int] = {}

    def add(self, key, n):
        self.counters[key] = self.counters.get(key, 0) + n
        return self.counters[key]


@pytest.fixture()
def member(monkeypatch, tmp_path):
    from phoenix_hpc.engines import factory, user_code
    from phoenix_hpc.launch import groups as groups_mod

    PARALLEL_STATE.clear()
    EVENTS.clear()
    monkeypatch.setattr(user_code, "load_engine_class", lambda name, python_path=(): FakeGlobalEngine)

    def create_engine(cfg, coord, groups, device, state_follows=False):
        EVENTS.append(("state_follows", state_follows))
        return FakeGlobalEngine(cfg, coord, groups, device)

    monkeypatch.setattr(factory, "create_engine", create_engine)

    def init_generation(store, generation, rank, grid, backend, timeout_s, device_id=None, sub_groups=True):
        EVENTS.append(("groups", generation, sub_groups))
        return ProcessGroups(("world", generation), None, None, None, generation), execute_coord()

    def execute_coord():
        from phoenix_hpc.topology import coord_of

        return coord_of(0, 1, 1, 1)

    monkeypatch.setattr(groups_mod, "init_generation", init_generation)
    monkeypatch.setattr(execute, "make_comm", lambda world, ranks, g: ("comm", g))
    cfg = SimpleNamespace(engine="fake", python_path=[], resilience=SimpleNamespace(
        recovery_path="auto", heartbeat_timeout_s=1.0, collective_timeout_s=2.0, chunk_bytes=1 << 16,
        checksum=DEFAULT_CHECKSUM))
    env = MemberEnv(cfg=cfg, run_dir=Path(tmp_path), world_comm=None, world_rank=0, client=FakeClient(),
                    progress=SimpleNamespace(set=lambda **kw: None), store=FakeStore(), nodes=["n0"],
                    domains={}, grid=Grid(1, 1, 1), backend="gloo", device=torch.device("cpu"),
                    log=lambda msg: EVENTS.append(("log", msg)), instruction_timeout_s=5.0)
    m = Member(env)
    monkeypatch.setattr(m, "_build_protector", lambda replan_ok=False: FakeProtector({}))
    return m


def _train(m: Member, steps: int, snapshots: dict) -> None:
    """``steps`` optimizer steps; after each, a committed snapshot of that step (as the protector keeps)."""
    for _ in range(steps):
        m.engine.optimizer_step()
        e = m.engine
        snapshots[e.step] = (e.opt.clone(), e.param.clone(), e.envelope())
    m.protector = FakeProtector(snapshots)


def _recover(m: Member, R: int, generation: int, failed: bool = False, action: str = "local_recovery",
             dead: tuple[int, ...] = ()):
    plan = _plan(generation, R, action=action)
    m.env.client.instructions.extend([{"type": "recover", "generation": generation, "plan": plan},
                                      {"type": "resume", "generation": generation}])
    m.release_groups()
    return m.recover({"type": "quiesce", "generation": generation, "dead": list(dead)}, failed=failed)


def _kinds(events, *names):
    return [e for e in events if e[0] in names]


def test_start_builds_only_the_world_group_and_takes_the_engines_groups(member):
    member.start()
    assert _kinds(EVENTS, "groups", "construct") == [("groups", 0, False), ("construct", 0)]
    assert _kinds(EVENTS, "state_follows") == [("state_follows", False)]  # a new job initialises its model
    assert member.groups is member.engine.groups and member.groups.dp == ("dp", 0)
    assert member.recovery_path == "rebuild"


def test_rebuild_at_the_live_step_keeps_the_live_state_and_leaves_nothing_of_the_old_generation(member):
    snaps: dict = {}
    member.start()
    _train(member, 3, snaps)
    old = member.engine
    live = (old.param.clone(), old.opt.clone(), old.envelope())
    old_ref = weakref.ref(old)
    del old
    EVENTS.clear()
    rec = _recover(member, R=3, generation=1)  # live step == R, clean: the live state, copied before teardown
    P = Phase
    assert member.recovery.trail == [P.QUIESCING, P.PLANNING, P.TRANSFERRING, P.VERIFYING, P.RESUMING, P.TRAINING]
    # teardown, then the world group, then construction, then the load: every step in this order
    assert _kinds(EVENTS, "teardown", "groups", "construct", "load") == [
        ("teardown", 0), ("groups", 1, False), ("construct", 1), ("load", 1)]
    assert _kinds(EVENTS, "state_follows") == [("state_follows", True)]  # loaded next: no random init
    new = member.engine
    assert torch.equal(new.param, live[0]) and torch.equal(new.opt, live[1]) and new.envelope() == live[2]
    # nothing of generation 0: global state, member's groups and the old engine object itself
    assert PARALLEL_STATE == {"generation": 1, "groups": new.groups}
    assert member.groups is new.groups and member.groups.generation == 1
    assert old_ref() is None, "the old engine is still referenced"
    assert (rec.path, rec.rolled_back, rec.recoverable_step) == ("rebuild", False, 3)
    assert {"host_copy", "teardown", "engine", "rollback"} <= set(rec.detail)
    assert any(e[0] == "log" and "on the rebuild path" in e[1] for e in EVENTS)
    assert member.env.client.sent[-1][:3] == ("recovered", 1, 3)


def test_rebuild_past_the_recoverable_step_loads_the_committed_snapshot(member):
    snaps: dict = {}
    member.start()
    _train(member, 5, snaps)
    rec = _recover(member, R=4, generation=1)  # live 5 > R: the committed snapshot of step 4
    e = member.engine
    assert e.step == 4 and torch.equal(e.param, snaps[4][1]) and torch.equal(e.opt, snaps[4][0])
    assert e.envelope() == snaps[4][2] and rec.rolled_back
    # a second recovery of the new generation works the same way
    _train(member, 2, snaps)
    rec2 = _recover(member, R=6, generation=2)
    assert member.engine.step == 6 and torch.equal(member.engine.param, snaps[6][1])
    assert PARALLEL_STATE["generation"] == 2 and rec2.path == "rebuild"


def test_a_dirty_survivor_at_the_recoverable_step_loads_its_snapshot_not_its_live_state(member):
    snaps: dict = {}
    member.start()
    _train(member, 3, snaps)
    member.phase = "optimizer_step"  # the error hit inside the update: the live state is not S(3)
    member.engine.param += 100.0
    rec = _recover(member, R=3, generation=1, failed=True)
    assert rec.dirty and rec.rolled_back
    assert torch.equal(member.engine.param, snaps[3][1])


def test_checkpoint_restart_on_the_rebuild_path(member, monkeypatch):
    from phoenix_hpc.launch import persist

    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)

    def restore_step(engine, groups, cfg, run_dir, step):
        assert groups is engine.groups and groups.generation == 1
        EVENTS.append(("checkpoint", step))
        engine.load_envelope({"step": step, "rng": 0})
        return step

    monkeypatch.setattr(persist, "restore_step", restore_step)
    EVENTS.clear()
    rec = _recover(member, R=2, generation=1, action="checkpoint_restart")
    assert _kinds(EVENTS, "teardown", "groups", "construct", "load", "checkpoint") == [
        ("teardown", 0), ("groups", 1, False), ("construct", 1), ("checkpoint", 2)]
    assert member.engine.step == 2 and rec.path == "rebuild" and "checkpoint_load" in rec.detail


def test_rebind_is_refused_for_an_engine_that_only_rebuilds(member):
    cfg = member.env.cfg
    cfg.resilience.recovery_path = "rebind"
    with pytest.raises(ConfigError, match=r"recovery_path: value 'rebind' .* engine 'fake' \(allowed: auto, rebuild\)"):
        Member(member.env)


def test_a_user_engine_is_checked_against_its_own_recovery_styles(tmp_path, monkeypatch):
    """``engine: package.module:Class``: the config cannot know the class's styles, so the user-code check
    (at submit and on every rank before MPI) refuses a recovery path the class does not support."""
    import sys

    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.engines.factory import check_user_code

    (tmp_path / "rebind_only_engine.py").write_text(
        "from phoenix_hpc.engines.torch_engine import TorchEngine\n\n\n"
        "class RebindOnly(TorchEngine):\n    supported_recovery_styles = ('rebind',)\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "rebind_only_engine", raising=False)

    def cfg(path):
        p = tmp_path / f"{path}.yaml"
        p.write_text(f"name: x\nengine: rebind_only_engine:RebindOnly\ndata: {{path: ds}}\n"
                     f"resilience: {{recovery_path: {path}}}\n")
        return load_job_config(p)

    check_user_code(cfg("auto"))
    check_user_code(cfg("rebind"))
    with pytest.raises(ConfigError) as exc:
        check_user_code(cfg("rebuild"))
    assert exc.value.problems == ["resilience.recovery_path: value 'rebuild' is not supported by engine "
                                  "'rebind_only_engine:RebindOnly' (allowed: auto, rebind)"]
    sys.modules.pop("rebind_only_engine", None)


class _InstructionStore:
    """The slot's instruction queue on the coordinator's store: signed messages, popped in order."""

    def __init__(self, secret: bytes):
        self.secret, self.queue, self.lock = secret, deque(), threading.Lock()

    def push(self, body: dict) -> None:
        from phoenix_hpc.control import protocol as P

        with self.lock:
            self.queue.append(P.encode(body, self.secret))

    def queue_pop(self, key, block=False):
        with self.lock:
            if not self.queue:
                raise torch.distributed.QueueEmptyError("empty")
            return self.queue.popleft()


def _real_client(store: _InstructionStore):
    """The real :class:`CoordinatorClient` instruction path (poll, arm, ack) over ``store``; acks are
    recorded instead of sent."""
    from phoenix_hpc.control import protocol as P
    from phoenix_hpc.control.armed import ArmedInstructions
    from phoenix_hpc.control.client import CoordinatorClient

    c = CoordinatorClient.__new__(CoordinatorClient)
    c.world_rank, c.pid, c.secret, c.store, c._dist = 0, 1, store.secret, store, torch.distributed
    c._lock, c.instructions = threading.Lock(), deque()
    c.armed = ArmedInstructions(0, 1, lambda body: c.acks.append(body))  # acks recorded, not sent
    c._guard = P.ReplayGuard(max_age_s=None)
    c._alive, c._rings_seen = None, None  # no liveness connection: every pump reads the store
    c._away_since = None  # the coordinator never went away
    c.acks = []
    c.send = lambda body: c.acks.append(body)
    c.stop_heartbeat = lambda: None
    return c


def test_start_answers_an_injection_while_the_generation_is_built(member, monkeypatch):
    """A job is `running` once every slot registered; building the generation (groups, engine, restore,
    protector) then takes seconds, tens of seconds on a loaded host. An ``inject`` sent meanwhile is armed
    by the slot during the set-up (here: while the engine is constructed), relative to the step the slot
    starts from, not only at the first training step (the coordinator refuses requests not confirmed in
    time); a ``quiesce`` heard then stays queued for the first step, and nothing fires."""
    import dataclasses

    from phoenix_hpc.engines import factory

    store = _InstructionStore(b"k" * 32)
    client = _real_client(store)
    cfg = SimpleNamespace(**vars(member.env.cfg), training=SimpleNamespace(steps=50))
    member.env = dataclasses.replace(member.env, client=client, cfg=cfg)
    fired = []
    member.watchdog = execute.quiesce_watchdog(client, fired.append, 0)
    member.watchdog.interval_s = 0.01
    during_setup = {}

    def slow_engine(cfg, coord, groups, device, state_follows=False):
        store.push({"type": "inject", "kind": "crash", "at_step": 1, "phase": "forward_backward",
                    "request_id": "r1", "steps_ahead": 3})
        store.push({"type": "inject", "kind": "crash", "at_step": 60, "phase": "forward_backward",
                    "request_id": "r2"})
        store.push({"type": "quiesce", "generation": 1})
        deadline = time.monotonic() + 5.0
        while len(client.acks) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        during_setup["acks"] = list(client.acks)
        return FakeGlobalEngine(cfg, coord, groups, device)

    monkeypatch.setattr(factory, "create_engine", slow_engine)
    try:
        member.start(start_step=0)
    finally:
        member.watchdog.close()
    acks = {a["request_id"]: a for a in during_setup["acks"]}
    assert acks["r1"]["armed"] is True and acks["r1"]["at_step"] == 3 and acks["r1"]["started_step"] == 0
    assert acks["r2"]["armed"] is False and "ends at step 50" in acks["r2"]["reason"]
    assert [i["request_id"] for i in client.injections] == ["r1"]
    assert [m["type"] for m in client.instructions] == ["quiesce"] and fired == []


def test_a_fault_in_the_first_step_after_a_recovery_restores_from_the_earlier_generations_copies(member):
    """No unprotected window: the new generation has committed nothing yet (its protector is empty), so its
    first-step fault is recovered from the previous generation's copies of R, kept until its first fence."""
    snaps: dict = {}
    member.start()
    _train(member, 3, snaps)
    first = member.protector
    _recover(member, R=3, generation=1)
    assert member.copies.kept == [first] and member.protector.copy_steps() == ([], {})
    member.phase = "optimizer_step"  # the first step after the recovery fails inside its update
    member.engine.param += 100.0
    rec = _recover(member, R=3, generation=2, failed=True)
    assert member.env.client.offered == {"opt/pp0/tp0/dp0": [3, 2, 1]}  # offered although generation 1 has none
    assert rec.rolled_back and member.engine.step == 3 and torch.equal(member.engine.param, snaps[3][1])
    assert member.copies.kept[-1] is first  # still kept: generation 2 has no fence either


def test_the_kept_copies_are_dropped_at_the_new_generations_first_fence(member):
    snaps: dict = {}
    member.start()
    _train(member, 3, snaps)
    _recover(member, R=3, generation=1)
    assert member.copies.kept
    member._phase(4, "forward_backward")
    assert member.copies.kept, "dropped before the new generation's first fence"
    member.protector.recoverable_step = 3
    member._phase(5, "forward_backward")
    assert member.copies.kept == []
    rec_protector = member.protector
    _train(member, 1, snaps)  # a generation with a fence of its own: only its own copies are kept over a recovery
    member.protector.recoverable_step = 4
    _recover(member, R=4, generation=2)
    assert member.copies.kept and member.copies.kept[0] is not rec_protector and len(member.copies.kept) == 1


def test_a_survivor_whose_h2h_thread_is_stuck_in_mpi_leaves_instead_of_answering_the_quiesce(member):
    """Open MPI can deadlock inside the H2H thread when a peer dies mid-transfer (runtime/h2h.ABANDON_JOIN_S):
    such a member cannot join another generation, so it raises TransportWedged (exit code 74, reported as a
    host fault) before it offers anything, rather than answer and then block in the next communicator."""
    from phoenix_hpc.errors import TransportWedged

    snaps: dict = {}
    member.start()
    _train(member, 2, snaps)
    member.protector.wedged = True
    member.env.client.offered = None
    with pytest.raises(TransportWedged, match="did not leave MPI") as err:
        _recover(member, R=2, generation=1, failed=True)
    assert err.value.exit_code == 74 and err.value.fault_kind == "host_fault"
    assert member.env.client.offered is None  # no quiesced answer went out


def test_each_recovery_reports_the_collectors_pauses_since_its_start(member, monkeypatch):
    """detail["gc"]: the seconds the garbage collector paused this process between the member's first sign of
    the fault and its resume (launch/heap.PAUSES); the mark is cleared, so the next recovery counts afresh."""
    from phoenix_hpc.launch import heap

    pauses = heap.GcPauses()
    monkeypatch.setattr(heap, "PAUSES", pauses)
    snaps: dict = {}
    member.start()
    _train(member, 2, snaps)
    pauses.total_s = 5.0  # collections before the fault do not count
    member._mark_gc()  # where the training loop marks the fault, before release_groups
    pauses.total_s = 5.25
    _recover(member, R=2, generation=1)
    assert member.recoveries[-1].detail["gc"] == 0.25 and member._gc_mark is None
    _train(member, 1, snaps)
    pauses.total_s = 6.0
    _recover(member, R=3, generation=2)  # recover() marks when nothing did before it
    assert member.recoveries[-1].detail["gc"] == 0.0


def test_a_survivor_frees_at_once_the_requests_to_the_peers_the_quiesce_names_dead(member):
    snaps: dict = {}
    member.start()
    _train(member, 2, snaps)
    prot = member.protector
    member.rank_map = {0: 0, 1: 4, 2: 9}  # logical -> world rank in the generation being left
    _recover(member, R=2, generation=1, dead=(3, 4))  # world 3: dead in an earlier generation, not a peer
    assert prot.closed_with == (True, frozenset({1}))  # logical rank 1 (world 4) only


def test_the_watchdogs_abort_makes_the_training_thread_leave_its_compute(member):
    from phoenix_hpc.launch.interrupt import StepInterrupted

    member.start()
    g = member.generation
    member.aborter = SimpleNamespace(aborted=False, generation=g, abort=lambda reason: SimpleNamespace(
        reason=reason, method="test", sockets=0, duration_s=0.0))
    member.interrupt.open(g)
    try:
        member._abort_on_quiesce({"type": "quiesce", "generation": g + 1})
        with pytest.raises(StepInterrupted, match=f"quiesce for generation {g + 1}"):
            torch.nn.Linear(1, 1)(torch.zeros(1, 1))
    finally:
        asked = member.interrupt.close()
    assert asked is not None


def test_a_survivor_reports_how_long_it_took_to_leave_the_step_and_to_quiesce(member):
    import time

    snaps: dict = {}
    member.start()
    _train(member, 2, snaps)
    left_at = time.perf_counter()
    member._left = (left_at, left_at - 0.25)  # as the training window left it: interrupted 0.25 s before
    rec = _recover(member, R=2, generation=1)
    assert rec.detail["leave"] == 0.25 and rec.detail["quiesce"] >= 0.0
    _train(member, 1, snaps)
    member._left = (time.perf_counter(), None)  # left on the failed collective: no interrupt in the window
    rec = _recover(member, R=3, generation=2)
    assert "leave" not in rec.detail and rec.detail["quiesce"] >= 0.0


def _plan(generation: int, R: int, ranks: int = 1, action: str = "hot_swap", steps_replayed: int = 0) -> dict:
    """A plan as a rank receives it (:meth:`RecoveryPlan.to_json`): world rank r is logical rank r of a
    ``1 x 1 x ranks`` grid, nothing to transfer."""
    return RecoveryPlan(action=action, old_generation=generation - 1, generation=generation,
                        rank_map=tuple((r, r) for r in range(ranks)), dead_world=(), released_spares=(), joins=(),
                        transfers=(), recoverable_step=R, rollbacks=(), replication=(),
                        steps_replayed=steps_replayed, grid=(1, 1, ranks)).to_json()


class Gen1NeverComplete(FakeStore):
    """Generation 1's second member never arrives at the arrival barrier (lost while joining)."""

    def add(self, key, n):
        v = super().add(key, n)
        return 0 if key == "phoenix/gen1/arrived" and n == 0 else v


def _cut_short_then(member, replan: dict) -> None:
    """Generation 1's hot swap to step 4 is cut short at its arrival barrier (:class:`Gen1NeverComplete`,
    the store's counters kept); the coordinator re-plans as generation 2 with ``replan`` and resumes it.
    Leaves the member's groups released, ready for ``member.recover`` of generation 1's quiesce."""
    counters = member.env.store.counters
    member.env.store = Gen1NeverComplete()
    member.env.store.counters = counters
    member.env.client.instructions.extend([{"type": "recover", "generation": 1, "plan": _plan(1, 4)},
                                           {"type": "quiesce", "generation": 2, "dead": [1]},
                                           {"type": "recover", "generation": 2, "plan": replan},
                                           {"type": "resume", "generation": 2}])
    member.release_groups()


def test_a_replan_heard_at_the_arrival_barrier_is_answered_and_the_next_plan_loads_the_host_copy(member):
    """Generation 1's plan names a second member that never arrives (lost while joining); the coordinator
    re-plans as generation 2. The survivor, waiting at the arrival barrier with its engine already ended (the
    rebuild path), answers the newer quiesce with what it quiesced with, and generation 2's plan loads the
    host copy it took for generation 1."""
    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)
    live = (member.engine.param.clone(), member.engine.opt.clone(), member.engine.envelope())
    EVENTS.clear()

    c = member.env.client
    _cut_short_then(member, _plan(2, 4))
    member.env.store.counters.clear()
    rec = member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    assert [x[:2] for x in c.sent] == [("quiesced", 1), ("quiesced", 2), ("recovered", 2)]
    assert c.sent[1][2:] == (4, False) and c.offered == {"opt/pp0/tp0/dp0": [4, 3, 2, 1]}  # as quiesced
    # the engine ended once (for generation 1) and was built once, for generation 2, from the host copy
    assert _kinds(EVENTS, "teardown", "construct", "load") == [("teardown", 0), ("construct", 2), ("load", 2)]
    assert _kinds(EVENTS, "groups") == [("groups", 2, False)]  # generation 1's groups were never built
    e = member.engine
    assert torch.equal(e.param, live[0]) and torch.equal(e.opt, live[1]) and e.envelope() == live[2]
    assert member.generation == 2 and rec.generation == 2 and member.copies.host_copy is None
    assert {"host_copy", "teardown", "engine"} <= set(rec.detail)  # the cut-short plan's teardown counts here
    assert member.env.store.counters == {"phoenix/gen1/arrived": 1, "phoenix/gen2/arrived": 1,
                                         "phoenix/gen2/built": 1}  # generation 1's groups were never built
    P = Phase  # cut short in its transfers' first part (the barrier): back to quiescing, answered, planned again
    assert member.recovery.trail == [P.QUIESCING, P.PLANNING, P.TRANSFERRING, P.QUIESCING, P.PLANNING,
                                     P.TRANSFERRING, P.VERIFYING, P.RESUMING, P.TRAINING]
    assert any(x[0] == "log" and "re-planned as generation 2" in x[1] for x in EVENTS)


def test_the_arrival_barrier_takes_only_a_newer_quiesce_and_leaves_other_instructions_in_order(member):
    member.start()
    member.generation = 3
    c = member.env.client
    older = {"type": "quiesce", "generation": 3}
    inj = {"type": "inject", "request_id": "x"}
    newer = {"type": "quiesce", "generation": 4}
    c.instructions.extend([older, inj, newer])
    assert member._take_newer_quiesce() is newer
    assert list(c.instructions) == [older, inj] and member._take_newer_quiesce() is None
    c.instructions.append({"type": "stop", "reason": "end"})
    with pytest.raises(execute.StopRequested):
        member._take_newer_quiesce()


def test_a_joining_spare_cut_short_at_arrival_offers_nothing_and_applies_the_next_plan(member):
    c = member.env.client
    c.instructions.extend([{"type": "quiesce", "generation": 2, "dead": [7]},
                           {"type": "recover", "generation": 2, "plan": _plan(2, 0)},
                           {"type": "resume", "generation": 2}])
    monkey_state = {"calls": 0}
    real_arrive = member._arrive_all

    def arrive(poll_s=0.01):  # generation 1's barrier: the coordinator re-planned meanwhile
        monkey_state["calls"] += 1
        if member.generation == 1:
            raise execute.RestoreInterrupted(c.instructions.popleft())
        return real_arrive(poll_s)

    member._arrive_all = arrive
    member.join(RecoveryPlan.from_json(_plan(1, 0, ranks=2)))
    assert monkey_state["calls"] == 2 and c.sent[0] == ("quiesced", 2, -1, False) and c.offered == {}
    assert c.sent[-1][:3] == ("recovered", 2, 0) and member.generation == 2


def test_a_replan_heard_while_waiting_for_resume_quiesces_again_from_the_kept_copies(member):
    """Generation 1 is restored and this member answered ``recovered``; another member is lost before the
    coordinator resumed, and it re-plans as generation 2. Instead of ``resume`` the member hears the newer
    quiesce: it quiesces again (its new protector closed, the copies of R it kept offered, its live step R,
    clean) and generation 2 resumes it at R."""
    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)
    want = (member.engine.param.clone(), member.engine.opt.clone(), member.engine.envelope())
    built = []
    member._build_protector = lambda replan_ok=False: built.append(FakeProtector({})) or built[-1]
    EVENTS.clear()
    c = member.env.client
    c.instructions.extend([{"type": "recover", "generation": 1, "plan": _plan(1, 4)},
                           {"type": "quiesce", "generation": 1},  # stale: ignored
                           {"type": "quiesce", "generation": 2, "dead": [1]},
                           {"type": "recover", "generation": 2, "plan": _plan(2, 4)},
                           {"type": "resume", "generation": 2}])
    member.release_groups()
    rec = member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    assert [x[:3] for x in c.sent] == [("quiesced", 1, 4), ("recovered", 1, 4), ("quiesced", 2, 4),
                                      ("recovered", 2, 4)]
    assert c.sent[2][3] is False and c.offered == {"opt/pp0/tp0/dp0": [4, 3, 2, 1]}  # the kept copies of R
    assert built[0].closed_with[0] is True  # generation 1's protector closed as after a fault
    assert all(p is not built[0] for p in member.copies.kept)  # it had no copy: not kept beside the next generation's
    assert rec.generation == 2 and [r.generation for r in member.recoveries] == [2]
    e = member.engine
    assert torch.equal(e.param, want[0]) and torch.equal(e.opt, want[1]) and e.envelope() == want[2]
    assert _kinds(EVENTS, "construct") == [("construct", 1), ("construct", 2)]
    assert any(x[0] == "log" and "while waiting for the resume of generation 1" in x[1] for x in EVENTS)
    P = Phase  # re-planned after ``recovered``: from resuming back to quiescing, as a member of generation 1
    assert member.recovery.trail == [P.QUIESCING, P.PLANNING, P.TRANSFERRING, P.VERIFYING, P.RESUMING,
                                     P.QUIESCING, P.PLANNING, P.TRANSFERRING, P.VERIFYING, P.RESUMING, P.TRAINING]


def test_a_members_recovery_follows_the_transition_table_and_refuses_any_other_step():
    """The phases of a member's part in a recovery and their table (launch/rank_recovery.py): every phase
    but the two ends has a way forward; a re-plan goes back to quiescing only from where a member waits on the
    others; a transition outside the table, or a start elsewhere than at quiescing or (a joining spare) at
    transferring, is refused."""
    from phoenix_hpc.errors import RecoveryError
    from phoenix_hpc.launch.rank_recovery import ENTRY, TRANSITIONS, RankRecovery, next_phase

    P = Phase
    assert set(TRANSITIONS) == set(P) and not TRANSITIONS[P.TRAINING] and not TRANSITIONS[P.STANDBY]
    assert {p for p, to in TRANSITIONS.items() if P.QUIESCING in to} == {P.TRANSFERRING, P.VERIFYING, P.RESUMING}
    assert ENTRY == {P.QUIESCING, P.TRANSFERRING}
    assert next_phase(P.TRANSFERRING, P.STANDBY) is P.STANDBY
    for now, to in [(P.PLANNING, P.QUIESCING), (P.QUIESCING, P.TRANSFERRING), (P.RESUMING, P.STANDBY),
                    (P.TRAINING, P.QUIESCING)]:
        with pytest.raises(RecoveryError, match=f"from {now.value} to {to.value}"):
            next_phase(now, to)
    with pytest.raises(RecoveryError, match="cannot start at resuming"):
        RankRecovery(SimpleNamespace(env=None), P.RESUMING)


def test_a_replan_to_an_earlier_step_loads_that_steps_snapshot_instead_of_the_cut_short_host_copy(member):
    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)

    _cut_short_then(member, _plan(2, 3))  # a lost holder: R 4 -> 3
    rec = member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    opt, par, env = snaps[3]
    e = member.engine
    assert e.step == 3 and torch.equal(e.opt, opt) and torch.equal(e.param, par) and e.envelope() == env
    assert (rec.generation, rec.recoverable_step, rec.rolled_back) == (2, 3, True)


def test_a_checkpoint_restart_after_a_cut_short_plan_loads_the_checkpoint_and_reads_no_snapshot(member, monkeypatch):
    """The re-plan after a cut-short hot swap is a restart from the persistent checkpoint of step 2, which no
    closed protector holds: the survivor, whose engine ended for the cut-short plan, loads the checkpoint and
    never asks its snapshots for step 2."""
    from phoenix_hpc.launch import persist

    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)
    del snaps[1], snaps[2]  # the protectors hold steps 3 and 4 only (the ping-pong pair)

    def restore_step(engine, groups, cfg, run_dir, step):
        EVENTS.append(("checkpoint", step))
        engine.load_envelope({"step": step, "rng": 0})
        return step

    monkeypatch.setattr(persist, "restore_step", restore_step)

    _cut_short_then(member, _plan(2, 2, action="checkpoint_restart"))
    EVENTS.clear()
    rec = member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    assert _kinds(EVENTS, "teardown", "construct", "load", "checkpoint") == [
        ("teardown", 0), ("construct", 2), ("checkpoint", 2)]
    assert member.engine.step == 2 and rec.generation == 2 and "checkpoint_load" in rec.detail
    assert member.copies.host_copy is None


def _cut_in(member, monkeypatch, where: str, load_step: bool = False) -> list:
    """Generation 1's restore is cut short after its arrival barrier, in this member's transfers
    (``where="transfers"``) or at its new protector's arrival (``"protector"``): the wait given the member's
    check polls it until the coordinator's newer quiesce (queued by the test) ends it. Every other generation
    runs through (with ``load_step``, its transfers bring the recoverable step, as a spare's do). Returns the
    checks' polls, as (generation, where)."""
    from phoenix_hpc.launch.transfers import TransferTimes

    polls: list = []
    real_build = member._build_protector

    def wait_until_cut(check, at):
        for _ in range(400):
            polls.append((member.generation, at))
            check()  # raises RestoreInterrupted once the newer quiesce is there
            time.sleep(0.005)
        raise AssertionError(f"the {at} wait was never cut short")

    def run_transfers(m, transfers, R, during=None, check=None):
        if during is not None:
            during()
        if where == "transfers" and m.generation == 1:
            assert check is not None, "the transfers are given no check"
            wait_until_cut(check, "transfers")
        if load_step:
            m.engine.load_envelope({"step": R, "rng": 0})
        return TransferTimes()

    def build_protector(replan_ok=False):
        if where == "protector" and member.generation == 1:
            assert replan_ok
            wait_until_cut(member._restore_check("protector"), "protector")
        return real_build(replan_ok)

    monkeypatch.setattr(transfers, "run", run_transfers)
    member._build_protector = build_protector
    return polls


def _replan_later(c, replan: dict | None, first: dict | None = None) -> threading.Timer:
    """Queue, 0.1 s from now (while the member waits in its cut-short restore), the coordinator's newer
    quiesce of generation 2 (or ``first`` instead), then ``replan`` (generation 2's plan) and its resume.
    Cancel the returned timer when done."""
    msgs = [first or {"type": "quiesce", "generation": 2, "dead": [7]}]
    if replan is not None:
        msgs += [{"type": "recover", "generation": 2, "plan": replan}, {"type": "resume", "generation": 2}]
    t = threading.Timer(0.1, lambda: c.instructions.extend(msgs))
    t.start()
    return t


def _recover_cut_then_replanned(member) -> "execute.RecoveryRecord":
    """A survivor's recovery of generation 1 (a hot swap to step 4) cut short once it waits (see
    :func:`_cut_in`) and re-planned as generation 2 to the same step, which resumes."""
    c = member.env.client
    c.instructions.append({"type": "recover", "generation": 1, "plan": _plan(1, 4)})
    member.release_groups()
    queued = _replan_later(c, _plan(2, 4), {"type": "quiesce", "generation": 2, "dead": [1]})
    try:
        return member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    finally:
        queued.cancel()


@pytest.mark.parametrize("where", ["transfers", "protector"])
def test_a_replan_heard_after_the_arrival_barrier_is_answered_from_what_the_survivor_quiesced_with(
        member, monkeypatch, where):
    """Generation 1's plan is cut short after every member arrived: a member was lost while this survivor
    was in its transfers or waited for the others at its new protector (rebuild path: its engine ended,
    built again and loaded from its host copy). It answers the newer quiesce with the copies and the live step
    it quiesced with, its generation-1 groups released, and generation 2's plan restores it to the same state."""
    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)
    live = (member.engine.param.clone(), member.engine.opt.clone(), member.engine.envelope())
    polls = _cut_in(member, monkeypatch, where)
    EVENTS.clear()
    c = member.env.client
    rec = _recover_cut_then_replanned(member)
    assert polls and {p for p in polls} == {(1, where)}  # the wait polled its check until the cut
    assert [x[:2] for x in c.sent] == [("quiesced", 1), ("quiesced", 2), ("recovered", 2)]
    assert c.sent[1][2:] == (4, False) and c.offered == {"opt/pp0/tp0/dp0": [4, 3, 2, 1]}  # as quiesced
    # generation 1 was built (groups, engine loaded from the host copy), its groups released at the cut;
    # generation 2 took its host copy from the engine of generation 1
    assert _kinds(EVENTS, "groups", "teardown", "construct", "release") == [
        ("release", 0), ("teardown", 0), ("groups", 1, False), ("construct", 1), ("release", 1), ("teardown", 1),
        ("groups", 2, False), ("construct", 2)]
    e = member.engine
    assert torch.equal(e.param, live[0]) and torch.equal(e.opt, live[1]) and e.envelope() == live[2]
    assert member.generation == 2 and rec.generation == 2 and member.groups.generation == 2
    said = {"transfers": "in its transfers of generation 1",
            "protector": "waiting for the members of generation 1 to start protection"}[where]
    assert any(x[0] == "log" and f"re-planned as generation 2 while {said}" in x[1] for x in EVENTS), EVENTS


def test_a_stop_heard_in_the_transfers_ends_the_restore(member, monkeypatch):
    """A ``stop`` (the job ended meanwhile) reaches a member in its transfers too: StopRequested."""
    snaps: dict = {}
    member.start()
    _train(member, 2, snaps)
    _cut_in(member, monkeypatch, "transfers")
    c = member.env.client
    c.instructions.extend([{"type": "recover", "generation": 1, "plan": _plan(1, 2)}])
    member.release_groups()
    queued = _replan_later(c, None, {"type": "stop", "reason": "the job ended"})
    try:
        with pytest.raises(execute.StopRequested, match="the job ended"):
            member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    finally:
        queued.cancel()


class FakeRebindEngine(FakeGlobalEngine):
    """The same engine on the rebind path: a survivor keeps it and gives it the new generation's groups."""

    recovery_style = "rebind"
    supported_recovery_styles = ("rebind",)

    def rebind(self, groups, coord):
        EVENTS.append(("rebind", groups.generation))
        self.groups = ProcessGroups(groups.world, ("dp", groups.generation), ("pp", groups.generation),
                                    ("tp", groups.generation), groups.generation)


@pytest.mark.parametrize("path,R", [("rebuild", 0), ("rebind", 3)])
def test_a_joining_spare_cut_short_in_its_transfers_ends_the_engine_it_built_and_offers_nothing(
        member, monkeypatch, path, R):
    """A spare whose plan is cut short in its transfers, after it built its engine: the engine (partly
    loaded) is ended, the spare answers with live step -1 and nothing to offer, and the next plan builds it
    again and restores it through its transfers. On the rebind path that matters: the next plan would keep an
    engine it finds and roll it back from a local snapshot, which a joining spare does not have."""
    if path == "rebind":
        from phoenix_hpc.engines import factory

        member.recovery_path = "rebind"
        monkeypatch.setattr(factory, "create_engine", lambda cfg, coord, groups, device, state_follows=False:
                            FakeRebindEngine(cfg, coord, groups, device))
    polls = _cut_in(member, monkeypatch, "transfers", load_step=True)
    c = member.env.client
    queued = _replan_later(c, _plan(2, R))
    try:
        member.join(RecoveryPlan.from_json(_plan(1, R)))
    finally:
        queued.cancel()
    assert polls and c.sent[0] == ("quiesced", 2, -1, False) and c.offered == {}
    assert _kinds(EVENTS, "construct", "teardown", "rebind") == [("construct", 1), ("teardown", 1), ("construct", 2)]
    assert c.sent[-1][:3] == ("recovered", 2, R) and member.generation == 2 and member.engine.step == R


def test_a_rebind_survivor_cut_short_after_its_rollback_answers_the_step_it_finished(member, monkeypatch):
    """Rebind path: the survivor finished step 5, the plan restores 4; it rolled back to S(4) and was cut
    short in its transfers. It answers the newer quiesce with live step 5 (the newest step it finished, which
    the next plan counts as replayed), not the 4 its engine holds now, and its record says it rolled back."""
    from phoenix_hpc.engines import factory

    member.recovery_path = "rebind"
    monkeypatch.setattr(factory, "create_engine", lambda cfg, coord, groups, device, state_follows=False:
                        FakeRebindEngine(cfg, coord, groups, device))
    snaps: dict = {}
    member.start()
    _train(member, 5, snaps)
    polls = _cut_in(member, monkeypatch, "transfers")
    EVENTS.clear()
    c = member.env.client
    rec = _recover_cut_then_replanned(member)
    assert polls and [x[:3] for x in c.sent] == [("quiesced", 1, 5), ("quiesced", 2, 5), ("recovered", 2, 4)]
    assert _kinds(EVENTS, "rebind", "construct") == [("rebind", 1), ("rebind", 2)]  # kept, never built again
    opt, par, env = snaps[4]
    e = member.engine
    assert e.step == 4 and torch.equal(e.opt, opt) and torch.equal(e.param, par) and e.envelope() == env
    assert (rec.generation, rec.live_step, rec.recoverable_step, rec.rolled_back) == (2, 5, 4, True)


def test_an_injection_for_phase_restore_waits_until_every_member_built_its_groups(member):
    """The member an injection for phase ``restore`` is armed on lands it only once the generation's
    ``built`` count says every member built its groups (that its own are built says only that every member
    started building theirs); unarmed, a member does not wait. A newer quiesce meanwhile cuts the wait short
    and the injection stays armed for the next plan."""
    member.start()
    member.generation, member.rank_map, member.env.grid = 1, {0: 0, 1: 1}, Grid(1, 1, 2)
    store = member.env.store
    t0 = time.monotonic()
    member.land_restore(5)  # nothing armed: no wait, the count is not read
    assert time.monotonic() - t0 < 0.05 and "phoenix/gen1/built" not in store.counters

    member.trigger.arm("transient", 5, "restore", "r1")
    store.add("phoenix/gen1/built", 1)  # this member's own count
    later = threading.Timer(0.2, lambda: store.add("phoenix/gen1/built", 1))
    later.start()
    t0 = time.monotonic()
    with pytest.raises(InjectedCommError):  # lands only after the second member's count
        member.land_restore(5)
    later.join()
    assert time.monotonic() - t0 >= 0.2 and not member.trigger.armed(5, "restore")
    assert [(i.request_id, p) for i, _, p in member.trigger.fired] == [("r1", "restore")]

    member.generation = 2
    member.trigger.arm("transient", 5, "restore", "r2")
    store.add("phoenix/gen2/built", 1)
    c = member.env.client
    queued = _replan_later(c, None, {"type": "quiesce", "generation": 3, "dead": [1]})
    try:
        with pytest.raises(execute.RestoreInterrupted) as cut:
            member.land_restore(5)
    finally:
        queued.cancel()
    assert cut.value.at == "groups" and int(cut.value.msg["generation"]) == 3
    assert member.trigger.armed(6, "restore")  # the first recovery at or after its step


def test_a_fault_for_a_recovery_phase_is_judged_at_the_step_the_job_was_in_not_at_the_recoverable_step(member):
    """An injection for phase ``restore`` armed for step 5 lands in a recovery that begins in iteration 5
    although it restores step 3 (the plan replays step 4): it is judged at ``recovery_step`` = R + replayed + 1,
    the same for every member, a joining spare included. Judged at R + 1 (= 4) it would wait for a later
    recovery, and a job with none left would report it only as missed."""
    assert RecoveryPlan.from_json(_plan(1, 3, steps_replayed=1)).recovery_step() == 5
    assert RecoveryPlan.from_json(_plan(1, 3)).recovery_step() == 4
    snaps: dict = {}
    member.start()
    _train(member, 4, snaps)
    member.trigger.arm("transient", 5, "restore", "r5")
    plan = _plan(1, 3, steps_replayed=1)
    member.env.client.instructions.extend([{"type": "recover", "generation": 1, "plan": plan},
                                           {"type": "resume", "generation": 1}])
    member.release_groups()
    with pytest.raises(InjectedCommError):
        member.recover({"type": "quiesce", "generation": 1, "dead": [5]}, failed=False)
    assert [(i.at_step, p) for i, _, p in member.trigger.fired] == [(5, "restore")]
