"""Pure parts of the local cluster: layout, config rendering, port choice, preflight, /proc bookkeeping."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from phoenix_hpc.errors import ClusterError
from phoenix_hpc.slurm import cluster_config as cc
from phoenix_hpc.slurm import procs
from phoenix_hpc.slurm.cluster import parse_topology, preflight_problems
from phoenix_hpc.slurm.ports import choose_ports

RUN = Path("/tmp/phx-unit")


def layout(nodes=6, switches=2, gpus=4, **kw):
    return cc.make_layout(run_dir=RUN, ctld_host="head", ctld_port=21000,
                          node_ports=tuple(22000 + i for i in range(nodes)), nodes=nodes, switches=switches,
                          gpus_per_node=gpus, **kw)


@pytest.fixture(scope="module")
def templates():
    return cc.load_templates()


def conf_lines(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_node_names_and_even_split():
    assert cc.node_names(3) == ("nid00001", "nid00002", "nid00003")
    assert cc.split_nodes(cc.node_names(7), 3) == (
        ("leaf0", ("nid00001", "nid00002", "nid00003")),
        ("leaf1", ("nid00004", "nid00005")),
        ("leaf2", ("nid00006", "nid00007")))
    with pytest.raises(ClusterError, match="switches=3"):
        cc.split_nodes(cc.node_names(2), 3)


def test_slurm_conf_has_every_node_on_its_own_port_with_fake_gpus(templates):
    lay = layout()
    text = cc.render_configs(lay, templates)["slurm.conf"]
    lines = conf_lines(text)
    nodes = [line for line in lines if line.startswith("NodeName=")]
    assert nodes[0] == ("NodeName=nid00001 NodeHostname=head NodeAddr=127.0.0.1 Port=22000 CPUs=8 "
                        "RealMemory=8192 Gres=gpu:4 Feature=gpu State=UNKNOWN")
    assert [n.split()[3] for n in nodes] == [f"Port={22000 + i}" for i in range(6)]
    settings = dict(line.split("=", 1) for line in lines if not line.startswith(("NodeName=", "PartitionName=")))
    assert settings["SlurmctldHost"] == "head(127.0.0.1)"
    assert settings["SlurmctldPort"] == "21000"
    assert settings["AuthInfo"] == f"socket={RUN}/munge/munged.socket"
    assert settings["StateSaveLocation"] == f"{RUN}/ctld/state"
    assert settings["SlurmdSpoolDir"] == f"{RUN}/nodes/%n/spool"
    assert settings["SlurmdParameters"] == "config_overrides"
    assert settings["TopologyPlugin"] == "topology/tree"
    assert settings["ReturnToService"] == "2"
    assert settings["SlurmdTimeout"] == "5" and settings["MessageTimeout"] == "5"
    assert settings["MpiDefault"] == "none"
    assert settings["GresTypes"] == "gpu"
    assert "${" not in text and "/etc/" not in text


def test_topology_gres_and_per_node_mpi_conf(templates):
    lay = layout(nodes=5, switches=2)
    out = cc.render_configs(lay, templates)
    assert conf_lines(out["topology.conf"]) == [
        "SwitchName=leaf0 Nodes=nid[00001-00003]",
        "SwitchName=leaf1 Nodes=nid[00004-00005]",
        "SwitchName=spine Switches=leaf[0-1]"]
    gres = conf_lines(out["gres.conf"])
    assert gres[0] == "AutoDetect=off"
    assert gres[1] == f"NodeName=nid00001 Name=gpu File={RUN}/nodes/nid00001/dev/nvidia[0-3]"
    assert len(gres) == 6
    assert lay.node_gpu_files("nid00002")[3] == RUN / "nodes/nid00002/dev/nvidia3"
    mpi = cc.render_mpi_conf(lay, "nid00004", templates)
    assert conf_lines(mpi) == [f"PMIxCliTmpDirBase={RUN}/nodes/nid00004/pmix"]
    assert cc.render_mpi_conf(lay, "nid00001", templates) != mpi


def test_no_gpus_means_no_gres_and_no_feature(templates):
    out = cc.render_configs(layout(nodes=2, gpus=0), templates)
    assert "Gres=" not in out["slurm.conf"] and "Feature=" not in out["slurm.conf"]
    assert conf_lines(out["gres.conf"]) == ["AutoDetect=off"]


def test_bad_request_lists_every_problem():
    with pytest.raises(ClusterError) as err:
        cc.make_layout(run_dir=Path("/tmp/a b;echo"), ctld_host="h", ctld_port=1, node_ports=(1,),
                       nodes=0, switches=3, gpus_per_node=17, cpus_per_node=0, slurmd_timeout_s=1)
    msg = str(err.value)
    for needle in ("nodes=0", "switches=3", "gpus_per_node=17", "cpus_per_node=0", "run_dir='/tmp/a b;echo'",
                   "slurmd_timeout_s=1", "node_ports: 1 ports for 0 nodes", "must all differ"):
        assert needle in msg, needle
    long_dir = Path("/tmp/" + "x" * 70)
    assert any("at most 60" in p for p in cc.validate_request(2, 1, 0, 8, long_dir))
    assert cc.validate_request(6, 2, 4, 8, RUN) == []


def test_choose_ports_skips_taken_and_reserved():
    taken = set(range(20000, 20010))
    reserved = set(range(20010, 20020))
    ports = choose_ports(5, lambda p: p not in taken, reserved, random.Random(1), port_range=(20000, 20025))
    assert len(set(ports)) == 5 and set(ports) <= set(range(20020, 20025))
    with pytest.raises(ClusterError, match="found only 5 of 6 free TCP ports"):
        choose_ports(6, lambda p: p not in taken, reserved, random.Random(1), port_range=(20000, 20025))


def test_preflight_names_setup_script_and_root():
    problems = preflight_problems(1000, lambda name: None if name in ("slurmd", "munged") else f"/bin/{name}")
    assert len(problems) == 2
    assert "munged, slurmd" in problems[0] and "scripts/setup.sh" in problems[0]
    assert "must run as root" in problems[1] and "1000" in problems[1]
    assert preflight_problems(0, lambda name: f"/bin/{name}") == []


def test_parse_topology():
    text = ("SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=nid[00001-00003]\n"
            "SwitchName=spine Level=1 LinkSpeed=1 Nodes=nid[00001-00006] Switches=leaf[0-1]\n")
    assert parse_topology(text) == [
        {"SwitchName": "leaf0", "Level": "0", "LinkSpeed": "1", "Nodes": "nid[00001-00003]"},
        {"SwitchName": "spine", "Level": "1", "LinkSpeed": "1", "Nodes": "nid[00001-00006]",
         "Switches": "leaf[0-1]"}]


def test_descendants_from_parent_map():
    parent_of = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert procs.descendants([10], parent_of) == {11, 12, 13}
    assert procs.descendants([12], parent_of) == set()


def test_proc_identity_survives_only_with_same_start_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = procs.proc_id(child.pid)
        assert me is not None and procs.is_alive(me)
        assert not procs.is_alive(procs.ProcId(child.pid, me.start_ticks + 1))  # a reused PID is not ours
        assert procs.stop_procs([me], term_timeout_s=5) == []
        assert not procs.is_alive(me)
    finally:
        child.kill()
        child.wait()
