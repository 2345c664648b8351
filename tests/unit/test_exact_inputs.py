"""Every input is refused or obeyed exactly, written as the input a user would type: files that are not
UTF-8, a directory, empty or unreadable (exit 2 naming the file); wrong types; NaN/infinity; hostlists that
Slurm refuses; timeouts no network can meet; and the pure parts of exact fault injection and replay
protection."""

from __future__ import annotations

import codecs
import json
import os
import struct
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.data.format import INDEX_HEADER

ROOT = Path(__file__).resolve().parents[2]
GPT_SMALL = ROOT / "examples" / "gpt-small.yaml"
LOCAL_SITE = ROOT / "sites" / "local.yaml"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


def phoenix(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_refused(r, *needles):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for n in needles:
        assert n in r.output, r.output


def _dataset() -> Path:
    """A dataset prefix that exists (a dry run refuses one that is not here, as submit does)."""
    from test_submit_cli import fake_dataset

    folder = Path.cwd() / "dataset"  # in the in_tmp folder of the test
    folder.mkdir(exist_ok=True)
    return fake_dataset(folder)


def cfg_text(**changes) -> str:
    data = yaml.safe_load(GPT_SMALL.read_text())
    data["data"]["path"] = str(_dataset())
    for section, value in changes.items():
        data.setdefault(section, {}).update(value) if isinstance(value, dict) else data.__setitem__(section, value)
    return yaml.safe_dump(data)


def unreadable(path: Path) -> Path:
    """Make ``path`` a file that cannot be read: mode 000 for a normal user; root reads any mode, so there it
    is a link to a file whose read fails (/proc/self/mem at offset 0 gives EIO)."""
    if os.geteuid() != 0:
        path.write_text("name: x\n")
        path.chmod(0)
    else:
        path.symlink_to("/proc/self/mem")
    return path


# ------------------------------------------------------------------------------- 1. files the CLI reads
def test_a_config_saved_as_utf16_is_refused_naming_the_file_and_encoding(in_tmp):
    p = in_tmp / "cfg.yaml"
    p.write_bytes(codecs.BOM_UTF16_LE + cfg_text().encode("utf-16-le"))
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), "cfg.yaml", "UTF-16", "save it as UTF-8")


def test_a_config_in_latin1_is_refused_with_the_offset(in_tmp):
    p = in_tmp / "cfg.yaml"
    p.write_bytes(cfg_text().replace("name: gpt-small", "name: caf\u00e9").encode("latin-1"))
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), "cfg.yaml", "not UTF-8", "byte 0xe9")


def test_a_config_with_a_utf8_byte_order_mark_is_read(in_tmp):
    p = in_tmp / "cfg.yaml"
    p.write_bytes(codecs.BOM_UTF8 + cfg_text().encode())
    r = phoenix("submit", "--site", "local", p, "--dry-run")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("content, needle", [(b"", "is empty"), (b"  \n\n", "is empty")])
def test_an_empty_config_is_refused(in_tmp, content, needle):
    p = in_tmp / "cfg.yaml"
    p.write_bytes(content)
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), "cfg.yaml", needle)


def test_an_unreadable_config_is_refused(in_tmp):
    p = unreadable(in_tmp / "cfg.yaml")
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), "cfg.yaml", "cannot be read")


def test_a_config_that_is_a_directory_is_refused(in_tmp):
    (in_tmp / "cfg.yaml").mkdir()
    assert_refused(phoenix("drill", in_tmp / "cfg.yaml", "--site", "local", "--dry-run"), "cfg.yaml", "directory")


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.write_bytes(codecs.BOM_UTF16_BE + LOCAL_SITE.read_text().encode("utf-16-be")), "UTF-16"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: unreadable(p), "cannot be read"),
])
def test_a_bad_site_profile_file_is_refused(in_tmp, make, needle):
    site = in_tmp / "mysite.yaml"
    make(site)
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text())
    assert_refused(phoenix("submit", "--site", site, p, "--dry-run"), "site profile file", "mysite.yaml", needle)


def fake_run_dir(tmp: Path) -> Path:
    rd = tmp / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(cfg_text())
    (rd / "job.json").write_text(json.dumps({"job_id": "123", "site": "local", "submitted_at": 1.0}))
    (rd / "journal.jsonl").write_text(json.dumps({"ts": 1.0, "event": "coordinator_started"}) + "\n")
    return rd


@pytest.mark.parametrize("name, make, needle", [
    ("job.json", lambda p: p.write_bytes(codecs.BOM_UTF16_LE + '{"job_id": "1"}'.encode("utf-16-le")), "UTF-16"),
    ("job.json", lambda p: p.write_bytes(b""), "is empty"),
    ("config.yaml", lambda p: p.write_bytes(b"name: \xff\xfe\n"), "not UTF-8"),
    ("journal.jsonl", lambda p: (p.unlink(), p.mkdir()), "is a directory"),
    ("journal.jsonl", lambda p: p.write_bytes(codecs.BOM_UTF16_LE + b'{\x00}\x00\n\x00'), "UTF-16"),
    ("coordinator.json", lambda p: p.mkdir(), "is a directory"),
])
def test_status_of_a_run_directory_with_a_bad_file_is_refused(in_tmp, name, make, needle):
    rd = fake_run_dir(in_tmp)
    p = rd / name
    if p.exists() and name != "journal.jsonl":
        p.unlink()
    make(p)
    assert_refused(phoenix("status", rd, "--json"), name, needle)


def test_status_with_a_runs_index_in_utf16_is_refused(in_tmp):
    home = in_tmp / "home"
    home.mkdir()
    (home / "runs.jsonl").write_bytes(codecs.BOM_UTF16_LE + '{"job_id": "1"}\n'.encode("utf-16-le"))
    assert_refused(phoenix("status", "--json"), "runs index file", "runs.jsonl", "UTF-16")


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: unreadable(p), "cannot be read"),
])
def test_a_bad_dataset_index_is_refused_before_submitting(in_tmp, make, needle):
    (in_tmp / "ds.bin").write_bytes(b"")
    make(in_tmp / "ds.idx")
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text(data={"path": str(in_tmp / "ds")}))
    assert_refused(phoenix("submit", "--site", "local", p), "dataset index file", "ds.idx", needle)
    assert not (in_tmp / "runs").exists()


def test_the_cost_model_journal_and_csv_inputs_are_read_the_same_way(in_tmp):
    j = in_tmp / "journal.jsonl"
    j.write_bytes(codecs.BOM_UTF16_LE + b"{\x00}\x00")
    assert_refused(phoenix("model", "fit", "--journal", j, "--gpus", "64"), "journal", "UTF-16")


# ----------------------------------------------------------------------------------- 2. strict types
@pytest.mark.parametrize("changes, needles", [
    ({"resilience": {"k": True}}, ["resilience.k", "True", "a boolean", "valid integer"]),
    ({"training": {"steps": "50"}}, ["training.steps", "'50'", "a string", "valid integer"]),
    ({"training": {"steps": 2.5}}, ["training.steps", "2.5", "valid integer"]),
    ({"training": {"lr": True}}, ["training.lr", "True", "a boolean", "valid number"]),
    ({"name": 7}, ["name", "7", "an integer", "valid string"]),
    ({"data": {"path": 3}}, ["data.path", "3", "valid string"]),
    ({"resilience": {"enabled": "yes please"}}, ["resilience.enabled", "valid boolean"]),
])
def test_a_value_of_the_wrong_type_is_refused_naming_field_value_and_type(in_tmp, changes, needles):
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text(**changes))
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), *needles)


def test_an_integer_for_a_float_field_is_a_float(in_tmp):
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text(training={"lr": 1, "min_lr": 0}))
    r = phoenix("submit", "--site", "local", p, "--dry-run", "--json")
    assert r.exit_code == 0, r.output


def test_a_site_profile_with_a_boolean_for_a_number_is_refused(in_tmp):
    site = in_tmp / "mysite.yaml"
    site.write_text(LOCAL_SITE.read_text().replace("gpus_per_node: 1", "gpus_per_node: true"))
    assert "gpus_per_node: true" in site.read_text()
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text())
    assert_refused(phoenix("submit", "--site", site, p, "--dry-run"), "node.gpus_per_node", "True", "valid integer")


# ---------------------------------------------------------------------------------- 3. NaN / infinity
@pytest.mark.parametrize("yaml_value", [".inf", "-.inf", ".nan", ".NaN"])
@pytest.mark.parametrize("field", ["lr", "weight_decay", "grad_clip"])
def test_nan_and_infinity_are_refused_in_every_float_field(in_tmp, field, yaml_value):
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text(training={field: "VALUE"}).replace("VALUE", yaml_value))
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), f"training.{field}", "finite number")


def test_an_infinite_timeout_is_refused(in_tmp):
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text(resilience={"collective_timeout_s": "VALUE"}).replace("VALUE", ".inf"))
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), "resilience.collective_timeout_s", "finite")



# every duration option of the CLI: (arguments before the option, the option)
DURATION_OPTIONS = [
    (["inject-fault", "--kind", "crash", "--rank", "0"], "--timeout-s"),
    (["inject-fault", "--kind", "crash", "--rank", "0", "--no-wait", "--at-step", "1400"], "--timeout-s"),
    (["drain", "--node", "nid00001"], "--timeout-s"),
    (["status", "--watch"], "--interval-s"),
    (["drill", GPT_SMALL, "--site", "local", "--faults", "1"], "--timeout-s"),
    (["demo"], "--timeout-s"),
]


@pytest.mark.parametrize("value, needles", [
    ("nan", ["nan is not allowed", "finite number"]),
    ("inf", ["inf is not allowed", "finite number"]),
    ("-inf", ["-inf is not allowed", "finite number"]),
    ("1e10", ["10000000000.0", "x<=2592000"]),  # beyond 9.2e9 s a socket timeout or a sleep overflows
])
@pytest.mark.parametrize("args, option", DURATION_OPTIONS)
def test_a_duration_option_that_is_not_finite_or_overflows_is_refused_before_anything_is_looked_up(
        in_tmp, monkeypatch, args, option, value, needles):
    def touched(*_a, **_k):
        raise AssertionError("a job or config was looked up before the option was checked")

    monkeypatch.setattr("phoenix_hpc.status.runs.find_run", touched)
    monkeypatch.setattr("phoenix_hpc.config.load.load_job_config", touched)
    r = phoenix(*args, option, value)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert_refused(r, f"'{option}'", *needles)

# ------------------------------------------------------------------------------------------ 4. hostlists
@pytest.mark.parametrize("option", ["--nodelist", "--exclude"])
@pytest.mark.parametrize("hostlist, why", [
    ("nid[001-", "does not close"),
    ("nid[1-3]x", "text after its last ']'"),
    ("nid[3-1]", "reversed"),
    ("nid1-3]", "did not open"),
    ("nid[1-3]]", "did not open"),
    ("nid[[1-3]]", "inside a bracket"),
    ("nid[a-b]", "not N or N-M"),
    ("nid[1-3,]", "not N or N-M"),
    ("nid00001,,nid00002", "empty host name"),
    ("nid 1", "not allowed in a host name"),
    ("", "is empty"),
])
def test_a_hostlist_slurm_refuses_is_refused(in_tmp, option, hostlist, why):
    r = phoenix("submit", "--site", "local", GPT_SMALL, "--dry-run", option, hostlist)
    assert_refused(r, option, repr(hostlist), why)


def test_a_valid_hostlist_goes_into_the_script_unchanged(in_tmp):
    (in_tmp / "cfg.yaml").write_text(cfg_text())
    r = phoenix("submit", "--site", "local", in_tmp / "cfg.yaml", "--dry-run", "--exclude", "nid[00005-00006],nid00004")
    assert r.exit_code == 0, r.output
    assert "#SBATCH --exclude=nid[00005-00006],nid00004" in r.stdout


def test_check_hostlist_returns_the_names_slurm_would():
    from phoenix_hpc.hostlist import check_hostlist

    # as `scontrol show hostnames` expands them (Slurm 22.05)
    assert check_hostlist("nid[01-3]", "--nodelist") == ["nid01", "nid02", "nid03"]
    assert check_hostlist("a[1-2]b[3-4]", "--nodelist") == ["a1b3", "a1b4", "a2b3", "a2b4"]
    assert check_hostlist("nid00001,x", "--nodelist") == ["nid00001", "x"]


# ------------------------------------------------------------------------------------------- 7. timeouts
@pytest.mark.parametrize("field, value, floor, reason", [
    ("heartbeat_interval_s", 0.005, "0.1 s", "signed TCP message"),
    ("heartbeat_timeout_s", 0.004, "1 s", "retransmission"),
    ("collective_timeout_s", 0.003, "2 s", "commit"),
])
def test_a_timeout_of_a_few_milliseconds_is_refused_with_the_reason(in_tmp, field, value, floor, reason):
    p = in_tmp / "cfg.yaml"
    p.write_text(cfg_text(resilience={field: value}))
    assert_refused(phoenix("submit", "--site", "local", p, "--dry-run"), f"resilience.{field}", str(value),
                   f"lower bound of {floor}", reason)


def test_the_example_timings_are_above_the_bounds():
    from phoenix_hpc.config.load import load_job_config

    for name in ("gpt-small", "perlmutter-7b", "vista-7b"):
        load_job_config(ROOT / "examples" / f"{name}.yaml")


# ---------------------------------------------------------------------- 5. exact injection (pure parts)
def test_a_target_arms_only_a_step_it_has_not_started():
    from phoenix_hpc.faults.trigger import arm_decision

    assert arm_decision(11, "forward_backward", started_step=10, last_step=50) == (11, "")
    assert arm_decision(11, "d2h", started_step=10, last_step=50) == (11, "")
    step, why = arm_decision(10, "optimizer_step", started_step=10, last_step=50)
    assert step is None and "already started step 10" in why
    step, why = arm_decision(51, "forward_backward", started_step=10, last_step=50)
    assert step is None and "ends at step 50" in why
    # the recovery phase fires at the first recovery at or after the step: any later step is fine
    assert arm_decision(60, "recovery", started_step=10, last_step=50) == (60, "")
    assert arm_decision(60, "restore", started_step=10, last_step=50) == (60, "")
    # steps_ahead: at_step is a lower bound, the target picks its own started step + steps_ahead
    assert arm_decision(5, "h2h", started_step=10, last_step=50, steps_ahead=3) == (13, "")
    assert arm_decision(20, "h2h", started_step=10, last_step=50, steps_ahead=3) == (20, "")


def test_the_outcome_of_an_armed_request():
    from phoenix_hpc.drills.inject import outcome_of

    fired = [{"request_id": "r", "world_rank": 1, "step": 7, "phase": "h2h"},
             {"request_id": "other", "world_rank": 2, "step": 7, "phase": "h2h"}]
    missed = [{"event": "inject_missed", "request_id": "r", "world_rank": 2, "reason": "lost"}]
    out = outcome_of("r", {1: 7, 2: 7}, "h2h", fired, missed)
    assert list(out["landed"]) == [1] and out["missed"] == {2: "lost"} and out["pending"] == [] and not out["exact"]
    assert outcome_of("r", {1: 7}, "h2h", fired, [])["exact"]
    assert not outcome_of("r", {1: 8}, "h2h", fired, [])["exact"]  # landed elsewhere than armed
    assert outcome_of("r", {1: 7, 3: 7}, "h2h", fired, [])["pending"] == [3]


def test_nothing_is_done_to_a_node_after_its_job_ended(monkeypatch):
    """kill-node on the local cluster: the slots landed, but the job is over before the node's slurmd would
    be killed: refused, nothing killed."""
    from phoenix_hpc.errors import FaultError
    from phoenix_hpc.drills import inject as I
    from phoenix_hpc.slurm import cluster as C

    killed = []
    monkeypatch.setattr(C, "kill_node", lambda *a, **k: killed.append(a) or [1])
    req = I.InjectRequest(kind="kill-node", phase="forward", at_step=5, target={"node": "nid00002"}, slots=(1,),
                          pids=(), node="nid00002")
    with pytest.raises(FaultError, match="nothing was done to node nid00002"):
        I.finish_kill_node(object(), req, 1.0, job_over=lambda: "the job finished")
    assert killed == []
    assert I.finish_kill_node(object(), req, 1.0, job_over=lambda: None)["node"] == "nid00002"
    assert len(killed) == 1


# --------------------------------------------------------------------------- 6. replay protection (pure)
def test_a_replayed_or_stale_message_is_refused():
    from phoenix_hpc.control import protocol as P

    secret = b"s" * 32
    now = [1000.0]
    guard = P.ReplayGuard(max_age_s=120, clock=lambda: now[0])
    raw = P.encode({"type": "stop", "reason": "x", "sent_at": 1000.0}, secret)
    body = P.decode(raw, secret)
    assert isinstance(body["nonce"], str) and len(body["nonce"]) == 24
    guard.check(body)
    with pytest.raises(P.ProtocolError, match="replayed stop message"):
        guard.check(P.decode(raw, secret))
    with pytest.raises(P.ProtocolError, match="stale inject message: sent 600.0 s ago"):
        guard.check(P.decode(P.encode({"type": "inject", "sent_at": 400.0}, secret), secret))
    with pytest.raises(P.ProtocolError, match="from the future"):
        guard.check(P.decode(P.encode({"type": "inject", "sent_at": 1500.0}, secret), secret))
    with pytest.raises(P.ProtocolError, match="without sent_at and nonce"):
        guard.check({"type": "stop"})
    # nonces are forgotten once no message carrying them could pass the age check; the replay is then stale
    now[0] = 1000.0 + 2 * 120 + 1
    guard.check(P.decode(P.encode({"type": "heartbeat"}, secret), secret)) if False else None
    guard._forget(now[0])
    assert guard._seen == {}
    with pytest.raises(P.ProtocolError, match="stale stop"):
        guard.check(P.decode(raw, secret))
    # the sender's timestamp and nonce are signed: changing them breaks the MAC
    msg = json.loads(raw)
    msg["body"]["sent_at"] = now[0]
    with pytest.raises(P.ProtocolError, match="does not verify"):
        P.decode(json.dumps(msg).encode(), secret)


def test_ranks_drop_a_replayed_instruction_but_let_it_wait_in_the_queue():
    from phoenix_hpc.control import protocol as P

    guard = P.ReplayGuard(max_age_s=None, clock=lambda: 1e9)
    body = P.stamp({"type": "quiesce"}, now=0.0)  # waited in the queue through a very long step: still fine
    guard.check(body)
    with pytest.raises(P.ProtocolError, match="replayed"):
        guard.check(dict(body))


@pytest.mark.parametrize("kinds", ["crash,,hang", "crash,", " , hang"])
def test_drill_kinds_with_an_empty_name_are_refused_not_dropped(in_tmp, kinds):
    """``--kinds crash,,hang`` drew from crash and hang as if the empty name were not there."""
    r = phoenix("drill", GPT_SMALL, "--site", "local", "--faults", "1", "--kinds", kinds, "--dry-run")
    assert_refused(r, "--kinds: an empty name", repr(kinds))


def test_a_bitflip_drill_of_a_job_whose_dp_is_derived_is_planned(in_tmp):
    """gpt-small derives dp = 2 from its nodes (no parallelism.dp): the drill judged bitflip against dp = 1."""
    r = phoenix("drill", GPT_SMALL, "--site", "local", "--faults", "2", "--kinds", "bitflip", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "bitflip" in r.output and "dp = 1" not in r.output
