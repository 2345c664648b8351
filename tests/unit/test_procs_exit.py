"""slurm/procs.exit_complete on a real multi-threaded process whose leader thread exits first."""

from __future__ import annotations

import subprocess
import sys
import time

from phoenix_hpc.slurm import procs

CHILD = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(1.5,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)  # the leader thread ends; the process lives on in the other thread
"""


def test_a_zombie_leader_is_not_a_complete_exit_until_the_last_thread_is_gone():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        proc = procs.proc_id(child.pid)
        assert proc is not None
        deadline = time.monotonic() + 5
        while procs.is_alive(proc) and time.monotonic() < deadline:  # the leader turns zombie first
            time.sleep(0.01)
        assert not procs.is_alive(proc)
        assert not procs.exit_complete(proc)  # its other thread still runs: sockets, memory not released
        while not procs.exit_complete(proc) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procs.exit_complete(proc)
    finally:
        child.kill()
        child.wait()
