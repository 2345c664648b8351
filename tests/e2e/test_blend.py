"""A Megatron-LM data blend (data.blend: two datasets, weights 0.3 / 0.7, split 98,2,0) with dropout on
(attention and hidden, 0.1) trains on the local cluster through a node loss and a hot swap to the final state
of the fault-free run of the same job: the spare's replayed step reads the blend's samples and draws the
dropout masks the lost rank drew. (That the blend's samples are those megatron-core's
BlendedMegatronDatasetBuilder yields for Megatron-LM's sizes is tests/unit/test_data_blend.py; that dropout
masks follow the seed and the sample position is tests/unit/test_torch_dropout.py.)"""

from __future__ import annotations

import shutil
import warnings

import pytest
from test_hotswap import CONFIG, TransportWedgedRerun, _check_recovery, _kill_node_at_step_10, _run_reference

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
    config = dict(CONFIG, name="blend", model=dict(CONFIG["model"], attention_dropout=0.1, hidden_dropout=0.1))
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
    _check_recovery(job, done, reference)
    assert done["final_hash"] == reference["final_hash"]
