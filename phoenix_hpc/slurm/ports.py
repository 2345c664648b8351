"""TCP ports for local clusters: free now, and not reserved by another local cluster on this machine.

A port that is free at this moment may still belong to another cluster (its slurmd was killed in a fault
drill and will bind the port again when the node is revived). So every cluster records its ports in a
machine-wide registry folder (one JSON file per run directory, under the system temp folder); choosing
ports happens under an exclusive ``flock`` on that folder, and skips every port of a registered cluster
whose ``cluster.json`` still says it is not stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from phoenix_hpc.errors import ClusterError
from phoenix_hpc.slurm.procs import pid_alive

# Below Linux's default ephemeral range (32768-60999, /proc/sys/net/ipv4/ip_local_port_range), so the
# kernel does not hand our ports to outgoing connections between choosing and binding them.
PORT_RANGE = (20000, 32000)


def registry_dir() -> Path:
    """The machine-wide folder of port reservations (``<tmp>/phoenix-slurm-ports``)."""
    return Path(tempfile.gettempdir()) / "phoenix-slurm-ports"


def port_is_free(port: int) -> bool:
    """True when a TCP socket can bind ``port`` on all addresses right now (slurmd/slurmctld bind 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def choose_ports(count: int, is_free: Callable[[int], bool], reserved: set[int],
                 rng: random.Random, port_range: tuple[int, int] = PORT_RANGE,
                 max_tries: int = 2000) -> list[int]:
    """Pick ``count`` distinct ports in ``[port_range[0], port_range[1])``, not in ``reserved``, free.

    Pure apart from ``is_free`` (injected). Raises :class:`ClusterError` naming how many ports were found
    when ``max_tries`` random candidates do not yield ``count`` usable ports.
    """
    chosen: list[int] = []
    taken: list[int] = []
    for _ in range(max_tries):
        if len(chosen) == count:
            break
        port = rng.randrange(*port_range)
        if port in reserved or port in chosen or port in taken:
            continue
        if is_free(port):
            chosen.append(port)
        else:
            taken.append(port)
    if len(chosen) < count:
        raise ClusterError(
            f"found only {len(chosen)} of {count} free TCP ports in {port_range[0]}-{port_range[1] - 1} "
            f"(taken: {sorted(taken)[:20]}{' ...' if len(taken) > 20 else ''}; reserved by other local "
            f"clusters: {len(reserved)})")
    return chosen


def _entry_path(run_dir: Path) -> Path:
    return registry_dir() / (hashlib.sha1(str(run_dir).encode()).hexdigest()[:16] + ".json")


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    folder = registry_dir()
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _entry_is_live(entry: dict) -> bool:
    """A reservation stays while its run directory's cluster.json is not ``stopped``, or, before that file
    is written, while the process that made the reservation runs (:func:`phoenix_hpc.slurm.procs.pid_alive`)."""
    try:
        state = json.loads((Path(entry["run_dir"]) / "cluster.json").read_text()).get("state")
    except FileNotFoundError:
        try:
            pid = int(entry.get("pid", 0))
        except (ValueError, TypeError):
            return False
        return pid > 0 and pid_alive(pid)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return state != "stopped"


def reserved_ports(exclude_run_dir: Path | None = None) -> set[int]:
    """Ports of all live reservations except that of ``exclude_run_dir``; drops dead reservations."""
    with _locked() as folder:
        return _reserved_locked(folder, exclude_run_dir)


def _reserved_locked(folder: Path, exclude_run_dir: Path | None) -> set[int]:
    out: set[int] = set()
    for path in folder.glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if exclude_run_dir is not None and entry.get("run_dir") == str(exclude_run_dir):
            continue
        if _entry_is_live(entry):
            out.update(int(p) for p in entry.get("ports", []))
        else:
            path.unlink(missing_ok=True)
    return out


def reserve_ports(run_dir: Path, count: int, rng: random.Random | None = None) -> list[int]:
    """Choose ``count`` ports for the cluster in ``run_dir`` and record them in the registry.

    The caller must write ``run_dir/cluster.json`` (state not ``stopped``) for the reservation to stay
    live. Raises :class:`ClusterError` when not enough free ports are found.
    """
    with _locked() as folder:
        reserved = _reserved_locked(folder, run_dir)
        ports = choose_ports(count, port_is_free, reserved, rng or random.Random())
        tmp = _entry_path(run_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_dir": str(run_dir), "ports": ports, "pid": os.getpid()}))
        tmp.replace(_entry_path(run_dir))
    return ports


def release_ports(run_dir: Path) -> None:
    """Remove the reservation of ``run_dir`` (no error when there is none)."""
    with _locked():
        _entry_path(run_dir).unlink(missing_ok=True)
