"""Byte-level indexed datasets: building (phoenix data prepare) and reading samples in a resumable order."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.data.indexed import TokenSamples, check_indexed_dataset, open_indexed_dataset
from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir
from phoenix_hpc.errors import DataError


@pytest.fixture()
def text_dir(tmp_path):
    src = tmp_path / "src dir; echo x"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("hello world\n" * 20)
    (src / "sub" / "b.py").write_text("def f():\n    return 'é'\n" * 30)
    (src / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "c.txt").write_text("cached, skipped")
    return src


def test_prepare_writes_one_document_per_text_file(text_dir, tmp_path):
    res = prepare_dataset(text_dir, tmp_path / "out" / "ds")
    assert (res.documents, res.skipped) == (2, 1)
    a, b = (text_dir / "a.txt").read_bytes(), (text_dir / "sub" / "b.py").read_bytes()
    assert res.tokens == len(a) + len(b)
    ds = open_indexed_dataset(tmp_path / "out" / "ds")
    assert bytes(ds[0].tolist()) == a and bytes(ds[1].tolist()) == b  # sorted path order
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ds.bin", "ds.idx"]


def test_prepare_max_bytes_cuts_last_file(text_dir, tmp_path):
    res = prepare_dataset(text_dir, tmp_path / "ds", max_bytes=250)
    assert res.tokens == 250
    ds = open_indexed_dataset(tmp_path / "ds")
    assert int(np.sum(ds.sequence_lengths)) == 250


def test_prepare_errors_leave_no_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        prepare_dataset(tmp_path / "missing", tmp_path / "o1")
    empty = tmp_path / "bin-only"
    empty.mkdir()
    (empty / "x.bin").write_bytes(b"\x00\xff")
    with pytest.raises(DataError, match="no text files"):
        prepare_dataset(empty, tmp_path / "o2")
    assert not list(tmp_path.glob("o1*")) and not list(tmp_path.glob("o2*"))


def test_samples_order_is_pure_function_of_seed_and_position(text_dir, tmp_path):
    prepare_dataset(text_dir, tmp_path / "ds")
    s1 = TokenSamples(tmp_path / "ds", seq_length=16, seed=3, vocab_size=256)
    s2 = TokenSamples(tmp_path / "ds", seq_length=16, seed=3, vocab_size=256)
    x_all, y_all = s1.batch(0, 2 * s1.num_samples + 3)  # crosses two epoch boundaries
    x5, y5 = s2.batch(5, 4)  # a fresh reader resumed at position 5
    assert torch_equal(x_all[5:9], x5) and torch_equal(y_all[5:9], y5)
    assert torch_equal(x_all[:, 1:], y_all[:, :-1])  # targets are inputs shifted by one token
    # every sample appears exactly once per epoch
    first = [s1.sample_index(p) for p in range(s1.num_samples)]
    assert sorted(first) == list(range(s1.num_samples))
    other = TokenSamples(tmp_path / "ds", seq_length=16, seed=4, vocab_size=256)
    assert [other.sample_index(p) for p in range(s1.num_samples)] != first


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_bad_datasets_rejected(tmp_path):
    with pytest.raises(DataError, match="missing"):
        check_indexed_dataset(tmp_path / "nothing")
    (tmp_path / "fake.idx").write_bytes(b"not an index at all, just text" * 3)
    (tmp_path / "fake.bin").write_bytes(b"xyz")
    with pytest.raises(DataError, match="MMIDIDX"):
        TokenSamples(tmp_path / "fake", 8, 0, 256)


def test_vocab_and_length_checks(text_dir, tmp_path):
    prepare_dataset(text_dir, tmp_path / "ds")
    with pytest.raises(DataError, match="vocab_size"):
        TokenSamples(tmp_path / "ds", 16, 0, vocab_size=128)
    with pytest.raises(DataError, match="seq_length"):
        TokenSamples(tmp_path / "ds", 100_000, 0, vocab_size=256)


def test_cli_prepare(text_dir, tmp_path):
    r = CliRunner().invoke(cli, ["data", "prepare", str(text_dir), str(tmp_path / "c" / "ds"), "--json"])
    assert r.exit_code == 0, r.output
    assert '"documents": 2' in r.output
    r = CliRunner().invoke(cli, ["data", "prepare", str(tmp_path / "nope"), str(tmp_path / "x")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = CliRunner().invoke(cli, ["data", "prepare", "--stdlib", str(tmp_path / "std"), "--max-bytes", "5000"])
    assert r.exit_code == 0, r.output
    assert str(stdlib_dir()) in r.output and "5,000 byte tokens" in r.output


def test_data_inspect_prints_documents_tokens_and_vocabulary(text_dir, tmp_path):
    import json

    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    prefix = tmp_path / "out" / "ds"
    prepare_dataset(text_dir, prefix)
    a, b = (text_dir / "a.txt").read_bytes(), (text_dir / "sub" / "b.py").read_bytes()
    r = CliRunner().invoke(cli, ["data", "inspect", str(prefix), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["documents"], d["tokens"], d["dtype"]) == (2, len(a) + len(b), "uint8")
    assert d["distinct_tokens"] == len(set(a + b)) and d["min_vocab_size"] == max(a + b) + 1
    text = CliRunner().invoke(cli, ["data", "inspect", str(prefix)]).output
    assert "2 documents" in text and f"needs model.vocab_size >= {max(a + b) + 1}" in text
    bad = CliRunner().invoke(cli, ["data", "inspect", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "missing" in bad.output and "Traceback" not in bad.output


def test_a_missing_blend_dataset_is_named_by_its_blend_field(text_dir, tmp_path):
    from phoenix_hpc.config.schema import DataConfig

    prepare_dataset(text_dir, tmp_path / "ok")
    data = DataConfig(blend=[{"path": str(tmp_path / "ok")}, {"path": str(tmp_path / "gone")}])
    assert [f for f, _ in data.prefix_fields] == ["data.blend[0].path", "data.blend[1].path"]
    with pytest.raises(DataError, match=r"^data\.blend\[1\]\.path '.*gone' is not a Megatron indexed dataset: missing"):
        for field, prefix in data.prefix_fields:
            check_indexed_dataset(prefix, field=field)
    assert DataConfig(path=str(tmp_path / "ok")).prefix_fields == [("data.path", str(tmp_path / "ok"))]
