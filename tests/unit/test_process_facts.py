"""Process facts read through psutil (slurm/procs.py, slurm/ports.py, drills/inject.py, bench/overhead_rank.py)
on real processes of this machine, and the GPU machine's wheel of it."""

import json
import os
import subprocess
import sys
import threading
import time

import psutil

from phoenix_hpc.bench.overhead_rank import rss_bytes, set_process_affinity, thread_cpu_ms
from phoenix_hpc.drills.inject import pid_alive
from phoenix_hpc.gpucheck import wheels
from phoenix_hpc.slurm import ports, procs


def _child(env_extra=None):
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, **(env_extra or {})})


def test_children_environment_and_identity_of_a_real_process():
    child = _child({"PHOENIX_PROC_MARK": "m-42"})
    try:
        parent_of = procs.parents()
        assert parent_of[child.pid] == os.getpid() and parent_of[os.getpid()] == os.getppid()
        assert child.pid in procs.descendants([os.getpid()])
        assert procs.environ_of(child.pid)["PHOENIX_PROC_MARK"] == "m-42"
        found = procs.processes_with_env({"PHOENIX_PROC_MARK": "m-42"})
        assert [p.pid for p in found] == [child.pid] and found[0] == procs.proc_id(child.pid)
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert procs.environ_of(child.pid) == {} and not pid_alive(child.pid)
    assert procs.processes_with_env({"PHOENIX_PROC_MARK": "m-42"}) == []


def test_a_zombie_is_not_alive_and_does_not_keep_its_port_reservation(tmp_path):
    child = _child()
    child.kill()  # not reaped yet: the process becomes a zombie, its PID still exists
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    assert not pid_alive(child.pid)
    entry = {"run_dir": str(tmp_path / "none"), "ports": [20001], "pid": child.pid}
    assert not ports._entry_is_live(entry)
    assert ports._entry_is_live({**entry, "pid": os.getpid()})
    child.wait()
    assert not ports._entry_is_live(entry)
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "cluster.json").write_text(json.dumps({"state": "up"}))
    assert ports._entry_is_live(entry)


def test_rss_grows_with_written_memory_and_threads_are_listed():
    before = rss_bytes()
    block = bytearray(64 << 20)  # zero-filled on allocation: written, so resident
    assert rss_bytes() - before >= 48 << 20
    del block
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="phoenix-test-idle")
    t.start()
    try:
        names = {k.split("#")[0] for k in thread_cpu_ms()}
        assert {"MainThread", "phoenix-test-idle"} <= names
        cpus = os.sched_getaffinity(0)
        assert set_process_affinity(cpus) >= 2
    finally:
        stop.set()
        t.join()


def test_the_gpu_machine_gets_psutil_and_its_stable_abi_wheel_fits():
    assert "psutil" in wheels.GPU_MISSING
    name = "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl"
    assert wheels.match_wheels([("psutil", "7.2.2")], [name]) == ([name], [])
    assert wheels.tags_fit("cp312", "abi3", "manylinux_2_17_x86_64")
    assert not wheels.tags_fit("cp313", "abi3", "manylinux_2_17_x86_64")  # built for a newer CPython
    assert not wheels.tags_fit("cp36", "abi3", "macosx_10_9_x86_64")
    assert not wheels.tags_fit("cp36", "cp36m", "manylinux_2_17_x86_64")


def test_a_start_environment_that_begins_with_empty_entries_is_read_whole(tmp_path, monkeypatch):
    """slurmstepd's /proc/PID/environ begins with NUL bytes (it writes its process title over the area);
    the marker variables after them must still be found, or a node kill finds no slurmstepd to kill."""
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "environ").write_bytes(b"\0" * 40 + b"SLURM_CONF=/x/slurm.conf\0PHOENIX_SLURMD_NODE=nid00001\0")
    monkeypatch.setattr(procs, "PROC", tmp_path)
    assert procs.environ_of(4242) == {"SLURM_CONF": "/x/slurm.conf", "PHOENIX_SLURMD_NODE": "nid00001"}
    assert procs.environ_of(4243) == {}
