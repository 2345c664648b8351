"""Pure parts of the Slurm client and hostlist helpers: key=value parsing, job ids, backend selection."""

from __future__ import annotations

import pytest

from phoenix_hpc.errors import SlurmError
from phoenix_hpc.slurm.client import parse_job_id, parse_key_values, parse_records
from phoenix_hpc.hostlist import compress, expand, split_active_spare


def test_key_values_keep_spaces_and_inner_equals():
    rec = parse_key_values("JobId=7 JobName=my job UserId=u(1) TRES=cpu=6,node=6 NodeList=nid[00001-00006] "
                           "Command=/runs/a b/job.sbatch Requeue=0")
    assert rec["JobName"] == "my job" and rec["TRES"] == "cpu=6,node=6"
    assert rec["Command"] == "/runs/a b/job.sbatch" and rec["Requeue"] == "0"


def test_topology_records():
    text = ("SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=nid[00001-00003]\n"
            "SwitchName=spine Level=1 LinkSpeed=1 Nodes=nid[00001-00006] Switches=leaf[0-1]\n\n")
    recs = parse_records(text)
    assert [r["SwitchName"] for r in recs] == ["leaf0", "spine"] and recs[1]["Switches"] == "leaf[0-1]"


@pytest.mark.parametrize("text, jid", [("123\n", "123"), ("45;cluster\n", "45")])
def test_job_id(text, jid):
    assert parse_job_id(text) == jid


def test_job_id_missing():
    with pytest.raises(SlurmError):
        parse_job_id("sbatch: error: nope\n")


def test_hostlists():
    assert expand("nid[00001-00003],x1") == ["nid00001", "nid00002", "nid00003", "x1"]
    assert compress(["nid00002", "nid00001"]) == "nid[00001-00002]"
    s = split_active_spare("nid[00001-00006]", 4)
    assert s.active == ("nid00001", "nid00002", "nid00003", "nid00004") and s.spare == ("nid00005", "nid00006")
    with pytest.raises(SlurmError):
        split_active_spare("nid[00001-00002]", 3)
    with pytest.raises(SlurmError):
        expand("nid[1-")


@pytest.mark.parametrize("state, ok", [("IDLE", True), ("ALLOCATED", True), ("MIXED", True), ("DOWN*", False),
                                       ("IDLE*", False), ("IDLE+DRAIN", False), ("DRAINED", False),
                                       ("FAIL", False), ("DOWN+NOT_RESPONDING", False), (None, False)])
def test_node_usable(state, ok):
    from phoenix_hpc.slurm.client import node_usable

    assert node_usable(state) is ok


def test_usable_node_names_and_counts():
    from phoenix_hpc.slurm.client import SlurmClient, usable_node_names

    text = ("NodeName=nid00001 State=IDLE Partitions=debug,gpu\nNodeName=nid00002 State=DOWN* Partitions=debug\n"
            "NodeName=nid00003 State=ALLOCATED Partitions=gpu\n")
    recs = parse_records(text)
    assert usable_node_names(recs) == ["nid00001", "nid00003"]
    assert usable_node_names(recs, "debug") == ["nid00001"]

    class _Out:
        stdout = text

    client = SlurmClient(runner=lambda args, **kw: _Out())
    assert client.node_counts() == (2, 3) and client.node_counts("debug") == (1, 2)


def test_unreachable_slurm_is_one_line():
    from phoenix_hpc.slurm.client import error_line, slurm_unreachable

    down = SlurmError("scontrol show job -o 1 failed (exit 1): scontrol: error: resolve_ctls_from_dns_srv: "
                      "res_nsearch error: Unknown host\nscontrol: error: fetch_config: DNS SRV lookup failed\n"
                      "scontrol: fatal: Could not establish a configuration source")
    stopped = SlurmError("scontrol show job -o 1 failed (exit 1): slurm_load_jobs error: Unable to contact slurm "
                         "controller (connect failure)")
    forgotten = SlurmError("scontrol show job -o 1 failed (exit 1): slurm_load_jobs error: Invalid job id specified")
    assert slurm_unreachable(str(down)) and slurm_unreachable(str(stopped)) and not slurm_unreachable(str(forgotten))
    assert error_line(down) == error_line(stopped) == "Slurm not reachable"
    assert error_line(forgotten) == str(forgotten)


def test_set_time_limit_runs_scontrol_update():
    from phoenix_hpc.slurm.client import SlurmClient

    calls = []

    class _Out:
        stdout = ""

    SlurmClient(runner=lambda args, **kw: calls.append(args) or _Out()).set_time_limit("53", 1)
    assert calls == [["scontrol", "update", "JobId=53", "TimeLimit=1"]]
