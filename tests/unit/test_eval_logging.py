"""Evaluation (training.eval_interval / eval_iters on the validation part of data.split) and metrics logging
(logging.tensorboard, logging.wandb): the config's refusals, the schedule, an evaluation's determinism and
that it leaves training untouched, the TensorBoard event files as TensorBoard reads them, and the W&B calls
(a fake ``wandb`` module: pure logic; CI does not install wandb)."""

from __future__ import annotations

import json
import random
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.launch.evaluate import Evaluator, eval_due, eval_position
from phoenix_hpc.launch.loop import StepRecord, train
from phoenix_hpc.validation import parse_model

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
MODEL = {"layers": 2, "hidden_size": 32, "heads": 4, "vocab_size": 256, "seq_length": 32}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    from phoenix_hpc.data.prepare import prepare_dataset

    tmp = tmp_path_factory.mktemp("evalds")
    rng = random.Random(3)
    (tmp / "text").mkdir()
    for i in range(100):
        (tmp / "text" / f"d{i:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))))
    prepare_dataset(tmp / "text", tmp / "ds")
    return str(tmp / "ds")


def _job(dataset: str, training: dict | None = None, model: dict | None = None, **extra) -> dict:
    return {"name": "ev", "data": {"blend": [{"path": dataset}], "split": "90,10,0"}, "model": dict(MODEL, **(model or {})),
            "training": dict({"steps": 6, "micro_batch_size": 2, "global_batch_size": 4, "seed": 1}, **(training or {})),
            **extra}


def _cfg(dataset, training=None, model=None, **extra) -> JobConfig:
    return parse_model(JobConfig, _job(dataset, training, model, **extra), source="test")


# --- configuration -----------------------------------------------------------------------------------
@pytest.mark.parametrize("change, needle", [
    ({"training": {"eval_interval": 0}}, "training.eval_interval"),
    ({"training": {"eval_interval": 2, "eval_iters": 0}}, "training.eval_iters"),
    ({"training": {"eval_iters": 5}}, "training.eval_iters: 5 is set but training.eval_interval is null"),
    ({"training": {"eval_interval": 2}, "data": {"path": "x"}}, "training.eval_interval: 2 needs a validation split"),
    ({"training": {"eval_interval": 2}, "split": "100,0,0"}, "data.split '100,0,0' gives it none"),
    ({"logging": {"tensorboard_dir": "tb"}}, "logging.tensorboard_dir: 'tb' is set but logging.tensorboard is false"),
    ({"logging": {"tensorboard": "yes"}}, "logging.tensorboard"),
    ({"logging": {"wandb": {"project": "p", "mode": "cloud"}}}, "logging.wandb.mode"),
    ({"logging": {"wandb": {"entity": "e"}}}, "logging.wandb.project"),
    ({"logging": {"wandb": {"project": "p", "colour": 1}}}, "logging.wandb.colour"),
])
def test_bad_evaluation_and_logging_settings_are_refused_naming_the_field(change, needle):
    job = _job("ds")
    for key, val in change.items():
        if key == "split":
            job["data"]["split"] = val
        elif key == "data":
            job["data"] = val
        elif key == "training":
            job["training"].update(val)
        else:
            job[key] = val
    with pytest.raises(ConfigError) as e:
        parse_model(JobConfig, job, source="test")
    assert needle in str(e.value) and e.value.exit_code == 2


def test_both_off_unless_asked_and_good_settings_are_kept():
    cfg = parse_model(JobConfig, _job("ds"), source="test")
    assert cfg.training.eval_interval is None and not cfg.logging.tensorboard and cfg.logging.wandb is None
    cfg = parse_model(JobConfig, _job("ds", {"eval_interval": 3, "eval_iters": 2},
                                      logging={"tensorboard": True, "wandb": {"project": "p", "mode": "offline"}}),
                      source="test")
    assert (cfg.training.eval_interval, cfg.training.eval_batches, cfg.logging.wandb.mode) == (3, 2, "offline")
    assert parse_model(JobConfig, _job("ds", {"eval_interval": 3}), source="test").training.eval_batches == 100
    for c in (cfg, parse_model(JobConfig, _job("ds"), source="test")):  # what submit --steps and resume re-read
        assert parse_model(JobConfig, c.model_dump(mode="json"), source="test") == c


def _submit(tmp_path, monkeypatch, dataset, logging: dict):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    job = _job(dataset, logging=logging, parallelism={"dp": 2}, resources={"nodes": 2, "spares": 1})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(cli, ["submit", "--site", "local", "job.yaml", "--dry-run"])


def test_submit_refuses_wandb_when_it_cannot_import_it(tmp_path, monkeypatch, dataset):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    r = _submit(tmp_path, monkeypatch, dataset, {"wandb": {"project": "p"}})
    assert r.exit_code == 2, r.output
    assert "logging.wandb: project 'p' needs the wandb package" in r.output and "Traceback" not in r.output
    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))  # installed
    r = _submit(tmp_path, monkeypatch, dataset, {"wandb": {"project": "p"}, "tensorboard": True})
    assert r.exit_code == 0, r.output


def test_submit_refuses_tensorboard_without_the_package(tmp_path, monkeypatch, dataset):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    r = _submit(tmp_path, monkeypatch, dataset, {"tensorboard": True})
    assert r.exit_code == 2 and "logging.tensorboard: true needs the tensorboard package" in r.output, r.output


# --- the schedule --------------------------------------------------------------------------------------
def test_eval_schedule_and_positions_follow_megatron_lms_validation_iterator():
    assert [s for s in range(0, 13) if eval_due(s, 4)] == [4, 8, 12]
    assert not any(eval_due(s, None) for s in range(10))
    # the k-th evaluation reads the global batches (k-1) x iters .. k x iters - 1 of the validation part
    assert [eval_position(s, 4, 3, 8) for s in (4, 8, 12)] == [0, 24, 48]
    with pytest.raises(ValueError):
        eval_position(5, 4, 3, 8)


def test_megatron_lms_validation_size_is_asked_of_the_builder(dataset):
    from phoenix_hpc.data.blend import blend_key

    assert blend_key(_cfg(dataset)).eval_samples == 4  # one global batch, never read
    # (train_iters // eval_interval + 1) x eval_iters x global batch
    assert blend_key(_cfg(dataset, {"steps": 10, "eval_interval": 3, "eval_iters": 2})).eval_samples == 4 * 2 * 4


class _FakeEngine:
    """Pure loop logic: a step counter, and an evaluation that records the step it saw (or fails once)."""

    def __init__(self, fail_eval_at=None):
        self.step = 0
        self.evaluated: list[tuple[int, int, int]] = []
        self.fail_eval_at = fail_eval_at

    def forward_backward(self):
        return 1.0

    def reduce_gradients(self):
        pass

    def optimizer_step(self):
        self.step += 1

    def evaluate(self, position, iters):
        if self.step == self.fail_eval_at:
            self.fail_eval_at = None
            raise RuntimeError("peer lost during the evaluation")
        self.evaluated.append((self.step, position, iters))
        return float(self.step)


def test_the_loop_evaluates_after_due_steps_before_their_record_and_redoes_an_interrupted_one():
    eng, order = _FakeEngine(fail_eval_at=4), []
    ev = Evaluator(2, 3, 8, on_eval=lambda r: order.append(("eval", r.step, r.loss)))
    hook = []
    with pytest.raises(RuntimeError, match="during the evaluation"):
        train(eng, 6, 100, on_step=lambda r: order.append(("step", r.step)), evaluator=ev,
              phase_hook=lambda s, p: hook.append((s, p)))
    assert order == [("step", 1), ("eval", 2, 2.0), ("step", 2), ("step", 3)]  # step 4 is never recorded
    assert (4, "evaluate") in hook and hook[-1] == (4, "evaluate")
    eng.step = 3  # the recovery restores S(3) (S(4)'s snapshot starts in iteration 5) and step 4 is trained again
    train(eng, 6, 100, on_step=lambda r: order.append(("step", r.step)), evaluator=ev)
    assert order[4:] == [("eval", 4, 4.0), ("step", 4), ("step", 5), ("eval", 6, 6.0), ("step", 6)]
    assert eng.evaluated == [(2, 0, 3), (4, 24, 3), (6, 48, 3)]


# --- the torch engine's evaluation -----------------------------------------------------------------
def test_an_evaluation_is_deterministic_and_changes_no_training_state(dataset, world1):
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.engines.base import GridCoord

    cfg = _cfg(dataset, {"eval_interval": 2, "eval_iters": 3}, {"attention_dropout": 0.1, "hidden_dropout": 0.1})
    eng = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
    train(eng, 2, 128)
    h, rng, env = eng.state_hash(), torch.get_rng_state(), json.dumps(eng.envelope(), sort_keys=True)
    grads = [p.grad.clone() for p in eng.model.parameters()]  # the last step's
    a, b = eng.evaluate(0, 3), eng.evaluate(0, 3)
    assert a == b and 0 < a < 10
    assert eng.evaluate(12, 3) != a  # other validation samples, another loss
    assert eng.state_hash() == h and torch.equal(torch.get_rng_state(), rng) and eng.model.training
    assert json.dumps(eng.envelope(), sort_keys=True) == env
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, eng.model.parameters()))  # no gradient computed


def test_training_with_evaluations_ends_in_the_state_of_training_without(dataset, world1):
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.engines.base import GridCoord

    cfg = _cfg(dataset, {"eval_interval": 2, "eval_iters": 2}, {"attention_dropout": 0.1, "hidden_dropout": 0.1})
    hashes, losses = [], []
    for evaluate in (False, True):
        eng = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
        records = []
        ev = Evaluator(2, 2, 4, on_eval=records.append) if evaluate else None
        steps = train(eng, 6, 128, evaluator=ev)
        hashes.append(eng.state_hash())
        losses.append([r.loss for r in steps])
    assert [r.step for r in records] == [2, 4, 6] and all(r.loss is not None for r in records)
    assert hashes[0] == hashes[1] and losses[0] == losses[1]


PP2_CHILD = r"""
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.validation import parse_model
from phoenix_hpc.engines.factory import create_engine
from phoenix_hpc.launch.groups import Grid, init_generation
from phoenix_hpc.data.blend import open_blend

rank, pp, work, job = int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[1]), json.loads(sys.argv[4])
job["parallelism"] = {"tp": 1, "pp": pp, "dp": 1}
cfg = parse_model(JobConfig, job, source="test")
open_blend(cfg)  # before the process groups, as a slot builds it
store = dist.FileStore(str(work / f"store-pp{pp}"), pp)
groups, coord = init_generation(store, 0, rank, Grid(1, pp, 1), "gloo", 60.0)
engine = create_engine(cfg, coord, groups, torch.device("cpu"))
a, b = engine.evaluate(8, 2), engine.evaluate(8, 2)
if a is not None:
    print("RESULT " + json.dumps([a, b]))
dist.destroy_process_group()
"""


def test_a_pipeline_evaluates_forward_only_to_the_loss_of_one_stage(dataset, tmp_path):
    """pp = 2 (two processes, gloo): the last stage's loss, the same twice, and the loss pp = 1 computes (to
    floating-point summation order: another grid)."""
    import subprocess

    job = json.dumps(_job(dataset, {"eval_interval": 2, "eval_iters": 2, "micro_batch_size": 1}))
    root = Path(__file__).resolve().parents[2]
    out = {}
    for pp in (1, 2):
        procs = [subprocess.Popen([sys.executable, "-c", PP2_CHILD, str(tmp_path), str(r), str(pp), job], cwd=root,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(pp)]
        for p in procs:
            so, se = p.communicate(timeout=300)
            assert p.returncode == 0, se[-3000:]
            for line in so.splitlines():
                if line.startswith("RESULT "):
                    out[pp] = json.loads(line[7:])
    assert out[1][0] == out[1][1] and out[2][0] == out[2][1]
    assert out[2][0] == pytest.approx(out[1][0], rel=1e-5)


def test_an_engine_without_evaluation_refuses_it_naming_the_field():
    from phoenix_hpc.engines.base import Engine
    from phoenix_hpc.errors import EngineError

    class NoEval(Engine):
        forward_backward = reduce_gradients = optimizer_step = optimizer_shard = param_shard = envelope = \
            load_optimizer_shard = load_param_shard = load_envelope = lambda *a: None

    with pytest.raises(EngineError, match="training.eval_interval"):
        NoEval().evaluate(0, 1)


# --- TensorBoard -------------------------------------------------------------------------------------
def _rec(step, loss=2.0):
    return StepRecord(step=step, loss=loss + step, step_time_ms=100.0 + step, tokens_per_s=1000.0 * step,
                      exposed_wait_ms=0.0, lr=1e-3 * step, grad_norm=0.5 * step)


def _journal(run_dir: Path, *records):
    with (run_dir / "journal.jsonl").open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


RECOVERY = {"ts": 1.0, "event": "recovery_done", "generation": 1, "action": "hot_swap", "total_s": 3.5,
            "phases": {"detect": 1.0, "reconfigure": 1.5, "params": 0.25, "optimizer": 0.5, "replay": 0.25},
            "steps_replayed": 1, "recoverable_step": 3, "replay_interrupted": False}


def _accumulate(path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path))
    acc.Reload()
    return acc


def test_tensorboard_gets_every_scalar_once_per_step_the_validation_loss_and_each_recovery(tmp_path):
    from phoenix_hpc.launch.evaluate import EvalRecord
    from phoenix_hpc.launch.metrics_log import JournalTail, MetricsLog, TensorBoardSink

    log = MetricsLog([TensorBoardSink(tmp_path / "tb")], JournalTail(tmp_path / "journal.jsonl"))
    for s in (1, 2, 3, 4, 5):  # steps 1-5, an evaluation after 2 and 4
        if s % 2 == 0:
            log.evaluation(EvalRecord(step=s, loss=9.0 + s, iters=2, position=0, eval_time_ms=1.0))
        log.step(_rec(s))
    later = json.dumps(dict(RECOVERY, generation=2, recoverable_step=5, total_s=2.0)) + "\n"
    _journal(tmp_path, {"ts": 0.5, "event": "commit"}, RECOVERY)
    with (tmp_path / "journal.jsonl").open("a") as f:
        f.write(later[:40])  # a line being written: read once whole
    for s in (4, 5, 6):  # a rollback to S(3): steps 4-5 again (other times), the evaluation of 4 again, then 6
        if s % 2 == 0:
            log.evaluation(EvalRecord(step=s, loss=9.0 + s, iters=2, position=0, eval_time_ms=1.0))
        log.step(_rec(s, loss=2.0))
    assert [e.step for e in _accumulate(tmp_path / "tb" / "recoveries").Scalars("recovery/total_s")] == [3]
    with (tmp_path / "journal.jsonl").open("a") as f:
        f.write(later[40:])
    log.close()  # reads the journal once more

    acc = _accumulate(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"lm loss", "lm loss validation", "learning-rate", "grad-norm", "iteration-time",
            "tokens-per-second"} <= tags
    loss = [(e.step, e.value) for e in acc.Scalars("lm loss")]
    assert loss == [(s, pytest.approx(2.0 + s)) for s in range(1, 7)]  # each step once: the replay replaced 4-5
    assert [(e.step, e.value) for e in acc.Scalars("lm loss validation")] == [(2, 11.0), (4, 13.0), (6, 15.0)]
    assert [e.value for e in acc.Scalars("iteration-time")] == pytest.approx([0.1 + s / 1e3 for s in range(1, 7)])
    assert [e.value for e in acc.Scalars("tokens-per-second")] == pytest.approx([1000.0 * s for s in range(1, 7)])
    rec = _accumulate(tmp_path / "tb" / "recoveries")
    assert [(e.step, e.value) for e in rec.Scalars("recovery/total_s")] == [(3, 3.5), (5, 2.0)]
    assert [e.value for e in rec.Scalars("recovery/reconfigure_s")] == [1.5, 1.5]
    assert rec.Scalars("recovery/steps_replayed")[0].value == 1.0
    assert "hot_swap at recoverable step 3" in rec.Tensors("recovery/text_summary")[0].tensor_proto.string_val[0].decode()


def test_a_spare_logs_from_its_first_step_and_not_the_recoveries_before_it(tmp_path):
    """A new writer (the spare that took the logging rank over at S(3)) purges what the lost rank logged from
    step 4 on, and logs only the recoveries from its start."""
    from phoenix_hpc.launch.metrics_log import JournalTail, MetricsLog, TensorBoardSink

    first = MetricsLog([TensorBoardSink(tmp_path / "tb")])
    for s in (1, 2, 3, 4, 5):
        first.step(_rec(s, loss=100.0))
    first.sinks[0]._writer.flush()  # the lost rank's process ends without closing
    _journal(tmp_path, dict(RECOVERY, recoverable_step=1, generation=1), dict(RECOVERY, generation=2))
    spare = MetricsLog([TensorBoardSink(tmp_path / "tb")], JournalTail(tmp_path / "journal.jsonl", since_step=3))
    for s in (4, 5, 6):
        spare.step(_rec(s))
    spare.close()
    acc = _accumulate(tmp_path / "tb")
    assert [(e.step, e.value) for e in acc.Scalars("lm loss")] == [(1, 101.0), (2, 102.0), (3, 103.0), (4, 6.0),
                                                                   (5, 7.0), (6, 8.0)]
    rec = _accumulate(tmp_path / "tb" / "recoveries")
    assert [e.value for e in rec.Scalars("recovery/generation")] == [2.0]


def test_a_failing_sink_stops_alone_and_never_ends_the_training(tmp_path):
    from phoenix_hpc.launch.metrics_log import MetricsLog, TensorBoardSink

    class Broken:
        def scalars(self, *a):
            raise OSError("disk full")

    warned = []
    log = MetricsLog([Broken(), TensorBoardSink(tmp_path / "tb")], warn=warned.append)
    log.step(_rec(1))
    log.step(_rec(2))
    log.close()
    assert len(warned) == 1 and "Broken stopped: OSError: disk full" in warned[0]
    assert [e.step for e in _accumulate(tmp_path / "tb").Scalars("lm loss")] == [1, 2]


# --- W&B (a fake module: pure logic) -----------------------------------------------------------------
class _FakeRun:
    def __init__(self, kw):
        self.kw, self.logged, self.finished = kw, [], False

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def finish(self):
        self.finished = True


def _fake_wandb():
    mod = types.ModuleType("wandb")
    mod.runs = []

    def init(**kw):
        mod.runs.append(_FakeRun(kw))
        return mod.runs[-1]

    mod.init = init
    return mod


def test_wandb_gets_the_same_values_once_per_step_in_one_resumable_run(tmp_path, monkeypatch, dataset):
    from phoenix_hpc.launch.evaluate import EvalRecord
    from phoenix_hpc.launch.metrics_log import JournalTail, metrics_log_of, wandb_run_id

    fake = _fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = _cfg(dataset, {"eval_interval": 2, "eval_iters": 1},
               logging={"wandb": {"project": "proj", "entity": "team", "mode": "offline"}})
    log = metrics_log_of(cfg, tmp_path, 0)
    assert len(log.sinks) == 1 and isinstance(log.tail, JournalTail)
    for s in (1, 2, 3):
        if s == 2:
            log.evaluation(EvalRecord(step=2, loss=7.5, iters=1, position=0, eval_time_ms=1.0))
        log.step(_rec(s))
    _journal(tmp_path, RECOVERY)
    for s in (3, 4):  # replayed 3 is not sent again; the recovery goes with the next step sent
        log.step(_rec(s))
    log.close()
    (run,) = fake.runs
    assert run.kw == {"project": "proj", "entity": "team", "name": "ev", "id": wandb_run_id(tmp_path),
                      "resume": "allow", "mode": "offline", "dir": str(tmp_path), "config": cfg.model_dump(mode="json")}
    assert [s for s, _ in run.logged] == [1, 2, 2, 3, 4]
    assert run.logged[1][1] == {"lm loss validation": 7.5}
    assert run.logged[2][1]["lm loss"] == 4.0 and run.logged[2][1]["learning-rate"] == pytest.approx(2e-3)
    assert run.logged[4][1]["recovery/total_s"] == 3.5 and run.logged[4][1]["recovery/detect_s"] == 1.0
    assert run.finished
    assert wandb_run_id(tmp_path) == wandb_run_id(tmp_path / ".") and len(wandb_run_id(tmp_path)) == 16


def test_nothing_is_logged_unless_asked_and_from_one_rank(dataset, tmp_path):
    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.launch.groups import Grid
    from phoenix_hpc.launch.metrics_log import is_logging_rank, metrics_log_of

    assert metrics_log_of(_cfg(dataset), tmp_path, 0) is None
    grid = Grid(2, 2, 2)
    loggers = [(pp, dp, tp) for pp in range(2) for dp in range(2) for tp in range(2)
               if is_logging_rank(GridCoord(pp=pp, dp=dp, tp=tp), grid)]
    assert loggers == [(1, 0, 0)]
