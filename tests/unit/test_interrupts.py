"""Ctrl-C: ``phoenix`` exits 130 (128 + SIGINT, what the demo and a shell report), never click's "Aborted!"
with exit 1 (which the README defines as an unexpected error), and leaves nothing half-written: ``data
prepare`` keeps a dataset pair whole, ``submit`` leaves no run directory without its job, nor a submitted job
without its record."""

from __future__ import annotations

import json
import os
import signal

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.interrupts import hold_interrupt


@pytest.fixture(autouse=True)
def sigint_as_in_a_terminal():
    """SIGINT at Python's default handler, as in a terminal; a suite started in the background by a
    non-interactive shell inherits it ignored. Put back afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_an_ignored_sigint_stays_ignored_and_holds_nothing():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with hold_interrupt() as held:
        os.kill(os.getpid(), signal.SIGINT)
    assert not held.interrupted and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_held_interrupt_waits_for_the_block_then_is_raised():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with hold_interrupt() as held:
            os.kill(os.getpid(), signal.SIGINT)
            done.append("rest of the block")
            assert held.interrupted
    assert done == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    with hold_interrupt() as held:  # no interrupt: nothing raised
        pass
    assert not held.interrupted


def test_an_error_of_the_block_after_an_interrupt_is_reported_as_the_interrupt():
    with pytest.raises(KeyboardInterrupt) as e:
        with hold_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            raise OSError("the child the same Ctrl-C ended")
    assert isinstance(e.value.__cause__, OSError)
    with pytest.raises(ValueError):  # no interrupt: the error itself
        with hold_interrupt():
            raise ValueError("x")


def test_ctrl_c_in_data_prepare_exits_130_and_leaves_the_old_dataset_whole(tmp_path, monkeypatch):
    from phoenix_hpc.data import prepare as P

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_text("text %d\n" % i * 50)
    r = CliRunner().invoke(cli, ["data", "prepare", str(src), str(tmp_path / "ds")])
    assert r.exit_code == 0, r.output
    before = {p.name: p.read_bytes() for p in tmp_path.glob("ds.*")}
    assert sorted(before) == ["ds.bin", "ds.idx"]
    real = P._text_bytes
    calls = []

    def interrupted(path):  # Ctrl-C while the second file is read
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(P, "_text_bytes", interrupted)
    r = CliRunner().invoke(cli, ["data", "prepare", str(src), str(tmp_path / "ds")])
    assert r.exit_code == 130 and "interrupted" in r.output and "Aborted" not in r.output
    assert {p.name: p.read_bytes() for p in tmp_path.glob("ds*")} == before  # no temporary file left


def _cfg(tmp_path):
    from test_submit_cli import write_cfg

    return write_cfg(tmp_path)


def test_ctrl_c_while_sbatch_runs_exits_130_and_writes_no_run_directory(tmp_path, monkeypatch):
    from phoenix_hpc.slurm.client import SlurmClient

    monkeypatch.chdir(tmp_path)

    def ctrl_c(self, script, extra_args=()):
        raise KeyboardInterrupt

    monkeypatch.setattr(SlurmClient, "submit", ctrl_c)
    monkeypatch.setattr(SlurmClient, "node_counts", lambda self, partition=None: (6, 6))
    r = CliRunner().invoke(cli, ["submit", "--site", "local", str(_cfg(tmp_path)), "--run-dir", "runs/x"])
    assert r.exit_code == 130 and "interrupted" in r.output and "Aborted" not in r.output
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_after_sbatch_accepted_the_job_records_it_then_exits_130(tmp_path, monkeypatch):
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.runs import known_runs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))  # a runs index of its own: other tests record runs

    def accepted_then_ctrl_c(self, script, extra_args=()):
        os.kill(os.getpid(), signal.SIGINT)  # arrives as sbatch returns the job id
        return "77"

    monkeypatch.setattr(SlurmClient, "submit", accepted_then_ctrl_c)
    monkeypatch.setattr(SlurmClient, "node_counts", lambda self, partition=None: (6, 6))
    r = CliRunner().invoke(cli, ["submit", "--site", "local", str(_cfg(tmp_path)), "--run-dir", "runs/x"])
    assert r.exit_code == 130 and "interrupted" in r.output
    rd = tmp_path / "runs" / "x"
    assert json.loads((rd / "job.json").read_text())["job_id"] == "77"  # the job Slurm has is on record
    assert (rd / "config.yaml").exists() and (rd / "job.sbatch").exists()
    assert [e["job_id"] for e in known_runs()] == ["77"]
