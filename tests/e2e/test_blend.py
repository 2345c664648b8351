"""A Megatron-LM data blend (data.blend: two datasets, weights 0.3 / 0.7, split 98,2,0) with dropout on
(attention and hidden, 0.1) trains on the local cluster through a node loss and a hot swap to the final state
of the fault-free run of the same job: the spare's replayed step reads the blend's samples and draws the
dropout masks the lost rank drew. (That the blend's samples are those megatron-core's
BlendedMegatronDatasetBuilder yields for Megatron-LM's sizes is tests/unit/test_data_blend.py; that dropout
masks follow the seed and the sample position is tests/unit/test_torch_dropout.py.)

Both runs also evaluate on the blend's validation part every 10 steps and after the last step, and write
TensorBoard event files: the job with the hot swap logs each step once, the validation losses at the
evaluation steps equal to the fault-free run's (an evaluation is a pure function of the step's parameters, and it never changes the
training: the final hash is the fault-free one), and the recovery the coordinator journaled as an event with
its phases."""

from __future__ import annotations

import shutil
import warnings

import pytest
from test_hotswap import CONFIG, PHASES, STEPS, TransportWedgedRerun, _check_recovery, _kill_node_at_step_10, \
    _run_reference

from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

pytestmark = pytest.mark.cluster



@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """Two datasets of different text (the first and the second half of the standard library's modules, 60
    files, so 60 documents, each: the 2 % validation part gets one) as a blend."""
    base = tmp_path_factory.mktemp("blend")
    files = sorted(p for p in stdlib_dir().glob("*.py") if p.is_file())[:120]
    entries = []
    for i, (name, weight) in enumerate((("first", 0.3), ("second", 0.7))):
        src = base / f"text-{name}"
        src.mkdir()
        for f in files[i * 60:(i + 1) * 60]:
            shutil.copy(f, src / f.name)
        prepare_dataset(src, base / name / "ds")
        entries.append({"path": str(base / name / "ds"), "weight": weight})
    return {"blend": entries, "split": "98,2,0"}


def test_a_blend_with_dropout_is_hot_swapped_to_the_fault_free_hash(env, blend, slurm_cluster, tmp_path,
                                                                    record_property):
    """As test_hotswap's node-loss test, with its rule for Open MPI 4.1's TCP deadlock (one rerun, reported)."""
    config = dict(CONFIG, name="blend", model=dict(CONFIG["model"], attention_dropout=0.1, hidden_dropout=0.1),
                  training=dict(CONFIG["training"], eval_interval=EVAL_INTERVAL, eval_iters=2),
                  logging={"tensorboard": True})
    reference = _run_reference(env, blend, tmp_path, "blend-ref", config)
    job, done, _victim, _killed_at, wedged = _kill_node_at_step_10(env, blend, slurm_cluster, tmp_path, "blend-kill",
                                                                 config)
    if done is None:
        why = f"blend-kill run again: {wedged}"
        record_property("rerun", why)
        warnings.warn(TransportWedgedRerun(why))
        job, done, _victim, _killed_at, wedged = _kill_node_at_step_10(env, blend, slurm_cluster, tmp_path,
                                                                     "blend-kill-again", config)
        assert done is not None, f"the survivor deadlocked in Open MPI in two runs in a row: {wedged}"
    rec = _check_recovery(job, done, reference)
    assert done["final_hash"] == reference["final_hash"]
    ref_tb, tb = _scalars(tmp_path / "blend-ref" / "tensorboard"), _scalars(job.run_dir / "tensorboard")
    # every EVAL_INTERVAL steps, and after the last step once more on the next batches (Megatron-LM's evaluation
    # after training; the last step is a multiple here, so it is evaluated twice, as in Megatron-LM)
    evals = list(range(EVAL_INTERVAL, STEPS + 1, EVAL_INTERVAL)) + [STEPS]
    assert [s for s, _ in tb["lm loss"]] == list(range(1, STEPS + 1))  # each step once, replayed ones too
    assert [s for s, _ in ref_tb["lm loss validation"]] == evals
    assert tb["lm loss validation"] == ref_tb["lm loss validation"]  # the same values, bit for bit
    assert {"learning-rate", "grad-norm", "iteration-time", "tokens-per-second"} <= set(tb)
    recoveries = _scalars(job.run_dir / "tensorboard" / "recoveries")
    assert recoveries["recovery/total_s"] == [(rec["recoverable_step"], pytest.approx(rec["total_s"]))]
    for phase in PHASES:
        assert recoveries[f"recovery/{phase}_s"] == [(rec["recoverable_step"], pytest.approx(rec["phases"][phase]))]
    assert not (tmp_path / "blend-ref" / "tensorboard" / "recoveries").exists()


EVAL_INTERVAL = 10


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a TensorBoard log directory as TensorBoard reads it: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
