"""The victim of the MPI survivor assets: it records its PID and SIGKILLs itself (a crash: no MPI_Finalize,
no goodbye); survivors wait until that process is gone. All "nodes" of the local cluster share one machine,
so /proc shows the victim's process to every survivor."""

import os
import signal
import time


def die(shared: str) -> None:
    """Write this process's PID to ``SHARED/victim.pid`` (atomically) and SIGKILL itself."""
    pid_file = os.path.join(shared, "victim.pid")
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as out:
        out.write(str(os.getpid()))
    os.replace(tmp, pid_file)
    os.kill(os.getpid(), signal.SIGKILL)


def wait_gone(shared: str, timeout_s: float = 30.0) -> None:
    """Wait (bounded) until the victim wrote its PID and that process is gone or a zombie."""
    pid_file = os.path.join(shared, "victim.pid")
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    victim_pid = int(open(pid_file).read())
    while os.path.exists(f"/proc/{victim_pid}") and time.monotonic() < deadline:
        try:
            with open(f"/proc/{victim_pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except OSError:  # reaped meanwhile
            return
        time.sleep(0.05)
