"""The local test cluster: a real Slurm (munged, slurmctld, one slurmd per node) on one machine.

Life cycle: :func:`up` starts it in a run directory, :func:`load_cluster` finds it again (from
``<run_dir>/cluster.json``), :func:`cluster_env` gives the environment that points Slurm commands at it,
:func:`status` reads node states and switches, :func:`kill_node` / :func:`revive_node` are the fault drill
(a node vanishes / comes back), :func:`down` stops exactly the daemons that :func:`up` started, by PID.

Run directory layout (all state of one cluster, nothing under /etc)::

    cluster.json            description: nodes, switches, ports, daemon PIDs, env (see ``Cluster``)
    etc/                    slurm.conf, topology.conf, gres.conf (SLURM_CONF points here)
    munge/                  munge.key, munged.socket, munged.pid, munged.log (this cluster's own munged)
    ctld/                   slurmctld.pid, slurmctld.log, state/ (StateSaveLocation)
    nodes/<node>/etc/       the same configs plus the node's own mpi.conf (PMIxCliTmpDirBase)
    nodes/<node>/           spool/, slurmd.log, slurmd.pid, pmix/, dev/nvidia0.. (fake GPU files)

Slurm behaviour relied on (Slurm 22.05, slurm.conf(5) and slurmd(8)): ``slurmd -N <name>`` runs one slurmd
per configured node name on one host; ``%n`` in SlurmdSpoolDir/SlurmdPidFile/SlurmdLogFile expands to that
name; slurmd reads gres.conf and mpi.conf from the folder of the slurm.conf it is given with ``-f``; a node
whose slurmd does not answer for SlurmdTimeout seconds is set DOWN; with ReturnToService=2 a DOWN node
returns to service when its slurmd registers again.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from phoenix_hpc.errors import ClusterError, SlurmError
from phoenix_hpc.files import read_text
from phoenix_hpc.slurm import ports as _ports
from phoenix_hpc.slurm import procs as _procs
from phoenix_hpc.slurm.cluster_config import (
    ClusterLayout,
    load_templates,
    make_layout,
    render_configs,
    render_mpi_conf,
    validate_request,
)
from phoenix_hpc.slurm.run import run_slurm

#: Environment variable naming the default run directory of ``phoenix cluster``.
RUN_DIR_ENV = "PHOENIX_CLUSTER_DIR"
#: Default run directory, relative to the current directory, when :data:`RUN_DIR_ENV` is not set.
DEFAULT_RUN_DIR = Path(".phoenix") / "cluster"
CLUSTER_JSON = "cluster.json"
FORMAT_VERSION = 1

#: Daemon binaries (started by this module) and client commands (run through ``slurm.run``) it needs.
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "scontrol", "squeue", "sbatch", "srun", "scancel")

# Set in each slurmd's environment; slurmd passes its environment on to the slurmstepd it starts, so a
# node's slurmstepd processes can be found again in /proc (see ``node_step_daemons``).
MARK_RUN_DIR = "PHOENIX_SLURMD_RUN_DIR"
MARK_NODE = "PHOENIX_SLURMD_NODE"


def default_run_dir() -> Path:
    """``$PHOENIX_CLUSTER_DIR`` if set, else ``./.phoenix/cluster``; always absolute."""
    return Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR).absolute()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Cluster:
    """A local cluster as recorded in ``<run_dir>/cluster.json``.

    ``state`` is ``starting``, ``up``, ``failed`` or ``stopped``. ``node_ports[n]`` is node ``n``'s slurmd
    TCP port on 127.0.0.1; ``switches`` maps each leaf switch to its nodes (the ``spine`` joins the leaves);
    ``daemons`` maps ``munged``, ``slurmctld`` and ``slurmd:<node>`` to their :class:`ProcId`.
    ``env`` holds the variables that point Slurm commands at this cluster (``SLURM_CONF``).
    """

    run_dir: Path
    state: str
    cluster_name: str
    ctld_host: str
    ctld_port: int
    partition: str
    nodes: list[str]
    node_ports: dict[str, int]
    switches: dict[str, list[str]]
    spine: str
    gpus_per_node: int
    cpus_per_node: int
    slurmd_timeout_s: int
    message_timeout_s: int
    slurm_conf: Path
    munge_socket: Path
    daemons: dict[str, _procs.ProcId] = field(default_factory=dict)
    started_at: str = ""

    @property
    def env(self) -> dict[str, str]:
        """Variables to add to a Slurm command's environment so that it talks to this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    @property
    def ports(self) -> list[int]:
        return [self.ctld_port, *self.node_ports.values()]

    def switch_of(self, node: str) -> str:
        for leaf, members in self.switches.items():
            if node in members:
                return leaf
        raise ClusterError(f"node={node!r}: not a node of the cluster in {self.run_dir} ({', '.join(self.nodes)})")

    def to_json(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "run_dir": str(self.run_dir),
            "state": self.state,
            "cluster_name": self.cluster_name,
            "ctld_host": self.ctld_host,
            "ctld_port": self.ctld_port,
            "partition": self.partition,
            "nodes": self.nodes,
            "node_ports": self.node_ports,
            "switches": self.switches,
            "spine": self.spine,
            "gpus_per_node": self.gpus_per_node,
            "cpus_per_node": self.cpus_per_node,
            "slurmd_timeout_s": self.slurmd_timeout_s,
            "message_timeout_s": self.message_timeout_s,
            "slurm_conf": str(self.slurm_conf),
            "munge_socket": str(self.munge_socket),
            "daemons": {name: p.to_json() for name, p in self.daemons.items()},
            "env": self.env,
            "started_at": self.started_at,
        }

    @classmethod
    def from_json(cls, data: dict) -> Cluster:
        return cls(
            run_dir=Path(data["run_dir"]), state=data["state"], cluster_name=data["cluster_name"],
            ctld_host=data["ctld_host"], ctld_port=int(data["ctld_port"]), partition=data["partition"],
            nodes=list(data["nodes"]), node_ports={k: int(v) for k, v in data["node_ports"].items()},
            switches={k: list(v) for k, v in data["switches"].items()}, spine=data["spine"],
            gpus_per_node=int(data["gpus_per_node"]), cpus_per_node=int(data["cpus_per_node"]),
            slurmd_timeout_s=int(data["slurmd_timeout_s"]),
            message_timeout_s=int(data["message_timeout_s"]), slurm_conf=Path(data["slurm_conf"]),
            munge_socket=Path(data["munge_socket"]),
            daemons={k: _procs.ProcId.from_json(v) for k, v in data.get("daemons", {}).items()},
            started_at=data.get("started_at", ""))

    def save(self) -> None:
        """Write ``cluster.json`` atomically (a reader never sees a half-written file)."""
        path = self.run_dir / CLUSTER_JSON
        tmp = path.with_name(CLUSTER_JSON + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)

    def alive_daemons(self) -> dict[str, _procs.ProcId]:
        """The recorded daemons that still run (same PID and start time)."""
        return {name: p for name, p in self.daemons.items() if _procs.is_alive(p)}


def load_cluster(run_dir: Path | str | None = None) -> Cluster:
    """Read the cluster recorded in ``run_dir`` (default: :func:`default_run_dir`).

    Raises:
        ClusterError: no ``cluster.json`` there (says to run ``phoenix cluster up``) or it is unreadable.
    """
    run_dir = Path(run_dir).absolute() if run_dir is not None else default_run_dir()
    path = run_dir / CLUSTER_JSON
    text = read_text(path, "cluster", error=ClusterError, missing_ok=True)
    if text is None:
        raise ClusterError(f"no local cluster in {run_dir} (no {CLUSTER_JSON}); start one with "
                           f"`phoenix cluster up --run-dir {run_dir}`")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ClusterError(f"{path}: cannot read ({exc})") from None
    try:
        return Cluster.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterError(f"{path}: not a phoenix cluster description (missing or bad field {exc})") from None


def cluster_env(cluster: Cluster | Path | str | None = None) -> dict[str, str]:
    """The variables that point Slurm commands at a cluster (``SLURM_CONF``); loads it if given a path."""
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    return cluster.env


def preflight_problems(euid: int, which: Callable[[str], str | None]) -> list[str]:
    """What stops ``cluster up`` on this machine: missing binaries (names scripts/setup.sh), not root.

    Pure given ``euid`` (effective user id) and ``which`` (``shutil.which``-like lookup).
    """
    problems = []
    missing = [b for b in (*DAEMONS, *CLIENTS) if which(b) is None]
    if missing:
        problems.append(f"Slurm/munge programs not found: {', '.join(missing)}; install them with "
                        "scripts/setup.sh (as root)")
    if euid != 0:
        problems.append(f"must run as root (effective uid is {euid}): slurmd starts job steps as the "
                        "submitting user, which needs root")
    return problems


# ---------------------------------------------------------------------------------------------- up


def _running_problem(run_dir: Path) -> str | None:
    """A message when a cluster recorded in ``run_dir`` still has daemons running, else None."""
    try:
        cluster = load_cluster(run_dir)
    except ClusterError:
        return None
    alive = cluster.alive_daemons()
    if not alive:
        return None
    return (f"a local cluster already runs in {run_dir}: {len(cluster.nodes)} nodes "
            f"({', '.join(cluster.nodes)}), slurmctld port {cluster.ctld_port}, SLURM_CONF={cluster.slurm_conf}, "
            f"daemons alive: {', '.join(sorted(alive))}; nothing started (stop it with "
            f"`phoenix cluster down --run-dir {run_dir}`)")


def _prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` or clear the files of a previous, stopped cluster in it.

    Refuses a non-empty folder that holds no ``cluster.json`` (it is not ours to clear).
    """
    if run_dir.exists():
        if not run_dir.is_dir():
            raise ClusterError(f"run_dir={str(run_dir)!r}: exists and is not a directory")
        entries = list(run_dir.iterdir())
        if entries and not (run_dir / CLUSTER_JSON).exists():
            raise ClusterError(f"run_dir={str(run_dir)!r}: not empty and holds no {CLUSTER_JSON}; "
                               "pick an empty or new directory")
        for name in ("etc", "munge", "ctld", "nodes"):
            shutil.rmtree(run_dir / name, ignore_errors=True)
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    # Job steps of non-root users read their node's folders (PMIx directory, munge socket): 0755, not the
    # 0700 of a fresh temporary directory.
    run_dir.chmod(0o755)


def _write_files(layout: ClusterLayout) -> None:
    """Write configs, the munge key, per-node folders and fake GPU files under the run directory."""
    templates = load_templates()
    configs = render_configs(layout, templates)
    layout.etc_dir.mkdir(parents=True)
    for name, text in configs.items():
        (layout.etc_dir / name).write_text(text)
    # munged refuses a key that others can read and folders that others can write; clients of any user must
    # reach the socket, so the folder is 0755 and the key 0400.
    layout.munge_dir.mkdir(mode=0o755)
    key = layout.munge_dir / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as out:
        out.write(os.urandom(1024))
    (layout.ctld_dir / "state").mkdir(parents=True)
    for node in layout.nodes:
        etc = layout.node_etc_dir(node)
        etc.mkdir(parents=True)
        for name, text in configs.items():
            (etc / name).write_text(text)
        (etc / "mpi.conf").write_text(render_mpi_conf(layout, node, templates))
        (layout.node_dir(node) / "spool").mkdir()
        layout.node_pmix_dir(node).mkdir()
        for gpu in layout.node_gpu_files(node):
            gpu.parent.mkdir(exist_ok=True)
            _make_fake_gpu(gpu)


def _make_fake_gpu(path: Path) -> None:
    """Create a stand-in for a GPU device file.

    A character device with the numbers of /dev/null (1, 3; devices.txt of the Linux kernel), so Slurm's
    gres/gpu accepts it as a device and sets ``CUDA_VISIBLE_DEVICES`` in the tasks' environment as on a
    real GPU node (checked on Slurm 22.05: set for ``--gpus-per-node=4``, but left unset with
    ``--gpu-bind=none`` and several tasks per node; ``SLURM_GPUS_ON_NODE`` is set in every case); reading or
    writing it does nothing. Where ``mknod`` is not allowed an empty regular file
    is used: Slurm still counts the GPU (and ``--gpus-per-node`` works) but sets no ``CUDA_VISIBLE_DEVICES``.
    """
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        path.touch()


def _spawn(argv: list[str], log: Path, env: Mapping[str, str] | None = None) -> _procs.ProcId:
    """Start a daemon in the foreground of its own session, output appended to ``log``."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True, close_fds=True)
    pid = _procs.proc_id(proc.pid)
    if pid is None:  # exited at once; keep a ProcId that can never match a live process
        return _procs.ProcId(proc.pid, -1)
    return pid


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"    {line}" for line in text[-lines:])


def _start_munged(layout: ClusterLayout) -> _procs.ProcId:
    d = layout.munge_dir
    return _spawn(["munged", "--foreground", "--force", f"--socket={layout.munge_socket}",
                   f"--key-file={d / 'munge.key'}", f"--pid-file={d / 'munged.pid'}",
                   f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}", "--num-threads=4"],
                  d / "munged.out")


def _start_slurmctld(layout: ClusterLayout) -> _procs.ProcId:
    return _spawn(["slurmctld", "-D", "-f", str(layout.slurm_conf)], layout.ctld_dir / "slurmctld.out",
                  {"SLURM_CONF": str(layout.slurm_conf)})


def _slurmd_argv(cluster_run_dir: Path, node: str) -> list[str]:
    return ["slurmd", "-D", "-f", str(cluster_run_dir / "nodes" / node / "etc" / "slurm.conf"), "-N", node]


def _start_slurmd(run_dir: Path, node: str) -> _procs.ProcId:
    conf = run_dir / "nodes" / node / "etc" / "slurm.conf"
    return _spawn(_slurmd_argv(run_dir, node), run_dir / "nodes" / node / "slurmd.out",
                  {"SLURM_CONF": str(conf), MARK_RUN_DIR: str(run_dir), MARK_NODE: node})


def _daemon_log(cluster: Cluster, name: str) -> Path:
    if name == "munged":
        return cluster.run_dir / "munge" / "munged.log"
    if name == "slurmctld":
        return cluster.run_dir / "ctld" / "slurmctld.log"
    return cluster.run_dir / "nodes" / name.split(":", 1)[1] / "slurmd.log"


def _wait_for(what: str, ready: Callable[[], bool], cluster: Cluster, watch: list[str], timeout_s: float,
              poll_s: float = 0.2) -> None:
    """Poll ``ready`` until true; fail early (with the daemon's log) when a watched daemon dies."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        for name in watch:
            if not _procs.is_alive(cluster.daemons[name]):
                raise ClusterError(f"{name} exited while waiting for {what}; its log "
                                   f"({_daemon_log(cluster, name)}) ends with:\n{_log_tail(_daemon_log(cluster, name))}")
        if time.monotonic() >= deadline:
            raise ClusterError(f"{what} not ready after {timeout_s:.0f} s; see the logs under {cluster.run_dir}")
        time.sleep(poll_s)


def _ctld_answers(cluster: Cluster) -> bool:
    try:
        proc = run_slurm(["scontrol", "ping"], env=cluster.env, timeout_s=10, check=False)
    except SlurmError:
        return False
    return proc.returncode == 0 and " is UP" in proc.stdout


def node_states(cluster: Cluster, timeout_s: float = 10) -> dict[str, dict[str, str]]:
    """``node -> {"state": ..., "reason": ...}`` from ``sinfo -N`` (states as sinfo's ``%T``: ``idle``,
    ``allocated``, ``down*`` ...; a trailing ``*`` means the node does not respond). Raises SlurmError."""
    proc = run_slurm(["sinfo", "--noheader", "--Node", "--format=%N|%T|%E"], env=cluster.env,
                     timeout_s=timeout_s)
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3 and parts[0]:
            out[parts[0]] = {"state": parts[1], "reason": "" if parts[2] == "none" else parts[2]}
    return out


def _nodes_in(cluster: Cluster, nodes: list[str], states: set[str]) -> bool:
    try:
        current = node_states(cluster)
    except SlurmError:
        return False
    return all(current.get(n, {}).get("state") in states for n in nodes)


def up(run_dir: Path | str | None = None, *, nodes: int = 6, switches: int = 2, gpus_per_node: int = 4,
       cpus_per_node: int = 8, slurmd_timeout_s: int = 5, message_timeout_s: int = 5,
       ready_timeout_s: float = 60.0) -> Cluster:
    """Start a local cluster in ``run_dir`` and wait until every node is ``idle``.

    Args:
        run_dir: folder for all state (default :func:`default_run_dir`); created if missing.
        nodes: number of nodes (``nid00001`` ...), each its own slurmd on its own port.
        switches: leaf switches of topology/tree (nodes split into contiguous blocks), plus one spine.
        gpus_per_node: fake GPUs per node (gres ``gpu``, ``Feature=gpu``); 0 for none.
        cpus_per_node: CPUs each node claims (SlurmdParameters=config_overrides lets it exceed the machine).
        slurmd_timeout_s: SlurmdTimeout: seconds before a silent node is marked DOWN.
        message_timeout_s: MessageTimeout: seconds an RPC may take. A killed node is DOWN about
            ``slurmd_timeout_s + message_timeout_s + 3`` s after its slurmd died (measured, Slurm 22.05).
        ready_timeout_s: seconds to wait for the daemons to come up.

    Returns:
        The :class:`Cluster`, also recorded in ``run_dir/cluster.json``.

    Raises:
        ClusterError: Slurm not installed (names scripts/setup.sh), not root, bad sizes, a cluster already
            running in ``run_dir`` (nothing is started then), no free ports, or a daemon failed to start
            (everything started is stopped again and the daemon's log tail is in the message).
    """
    run_dir = Path(run_dir).absolute() if run_dir is not None else default_run_dir()
    problems = preflight_problems(os.geteuid(), shutil.which)
    problems += validate_request(nodes, switches, gpus_per_node, cpus_per_node, run_dir, slurmd_timeout_s,
                                 message_timeout_s)
    if problems:
        raise ClusterError("cannot start the local cluster:\n" + "\n".join(f"  - {p}" for p in problems))
    running = _running_problem(run_dir)
    if running:
        raise ClusterError(running)
    _prepare_run_dir(run_dir)
    ports = _ports.reserve_ports(run_dir, nodes + 1)
    try:
        layout = make_layout(run_dir=run_dir, ctld_host=socket.gethostname().split(".")[0],
                             ctld_port=ports[0], node_ports=tuple(ports[1:]), nodes=nodes, switches=switches,
                             gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node,
                             slurmd_timeout_s=slurmd_timeout_s, message_timeout_s=message_timeout_s)
        _write_files(layout)
    except BaseException:
        _ports.release_ports(run_dir)
        raise
    cluster = Cluster(
        run_dir=run_dir, state="starting", cluster_name=layout.cluster_name, ctld_host=layout.ctld_host,
        ctld_port=layout.ctld_port, partition=layout.partition, nodes=list(layout.nodes),
        node_ports=dict(zip(layout.nodes, layout.node_ports)),
        switches={leaf: list(members) for leaf, members in layout.switches}, spine=layout.spine,
        gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node, slurmd_timeout_s=slurmd_timeout_s,
        message_timeout_s=message_timeout_s, slurm_conf=layout.slurm_conf, munge_socket=layout.munge_socket, started_at=_now())
    cluster.save()
    try:
        cluster.daemons["munged"] = _start_munged(layout)
        cluster.save()
        _wait_for("munged", layout.munge_socket.exists, cluster, ["munged"], ready_timeout_s)
        cluster.daemons["slurmctld"] = _start_slurmctld(layout)
        cluster.save()
        _wait_for("slurmctld", lambda: _ctld_answers(cluster), cluster, ["munged", "slurmctld"], ready_timeout_s)
        for node in layout.nodes:
            cluster.daemons[f"slurmd:{node}"] = _start_slurmd(run_dir, node)
        cluster.save()
        _wait_for("all nodes idle", lambda: _nodes_in(cluster, cluster.nodes, {"idle"}), cluster,
                  list(cluster.daemons), ready_timeout_s)
    except BaseException:
        _stop_all(cluster)
        cluster.state = "failed"
        cluster.save()
        _ports.release_ports(run_dir)
        raise
    cluster.state = "up"
    cluster.save()
    return cluster


# ------------------------------------------------------------------------------- nodes and status


def node_step_daemons(cluster: Cluster, node: str | None = None) -> list[_procs.ProcId]:
    """slurmstepd processes started by this cluster's slurmd (of ``node`` only, if given), found by the
    marker variables every slurmd is started with."""
    marker = {MARK_RUN_DIR: str(cluster.run_dir)}
    if node is not None:
        marker[MARK_NODE] = node
    slurmds = {p.pid for name, p in cluster.daemons.items() if name.startswith("slurmd:")}
    return [p for p in _procs.processes_with_env(marker) if p.pid not in slurmds]


def _node_procs(cluster: Cluster, node: str | None) -> list[_procs.ProcId]:
    """slurmstepd of ``node`` (or all nodes) plus every process below them (the job's tasks)."""
    stepds = node_step_daemons(cluster, node)
    below = _procs.descendants(p.pid for p in stepds)
    return stepds + [p for p in (_procs.proc_id(pid) for pid in below) if p is not None]


def node_kill_targets(cluster: Cluster, node: str) -> list[_procs.ProcId]:
    """What :func:`kill_node` kills: ``node``'s slurmd, its slurmstepd and their tasks (a scan of ``/proc``:
    tens to hundreds of milliseconds on a busy host, so a measurement takes it before its clock starts).

    Raises :class:`ClusterError` for an unknown node."""
    cluster.switch_of(node)  # validates the name
    targets = []
    slurmd = cluster.daemons.get(f"slurmd:{node}")
    if slurmd is not None and _procs.is_alive(slurmd):
        targets.append(slurmd)
    return targets + _node_procs(cluster, node)


def kill_node(cluster: Cluster, node: str, *, mark_down_reason: str | None = None,
              timeout_s: float = 10.0, targets: list[_procs.ProcId] | None = None) -> list[int]:
    """Make ``node`` vanish as in a hardware failure: SIGKILL its slurmd, its slurmstepd and their tasks.

    Slurm then notices by itself: the node is set DOWN after SlurmdTimeout (``cluster.slurmd_timeout_s``)
    and, for jobs started with ``--no-kill``, removed from the job, which keeps running. With
    ``mark_down_reason`` the node is also set DOWN at once (``scontrol update nodename=... state=down``).
    ``targets``: :func:`node_kill_targets` of ``node`` taken beforehand (the first SIGKILL then follows the
    call at once); a process that appeared since is caught by the sweep after the kill.

    Returns the PIDs killed. Raises :class:`ClusterError` for an unknown node or a process that survives
    SIGKILL, :class:`SlurmError` when the ``scontrol update`` fails.
    """
    targets = node_kill_targets(cluster, node) if targets is None else list(targets)
    left = _procs.stop_procs(targets, term_timeout_s=timeout_s, first_signal=signal.SIGKILL)
    # A task may have forked between the scan and the kill: sweep once more.
    extra = _node_procs(cluster, node)
    left += _procs.stop_procs(extra, term_timeout_s=timeout_s, first_signal=signal.SIGKILL)
    if left:
        raise ClusterError(f"processes of node {node} survived SIGKILL: {[p.pid for p in left]}")
    if mark_down_reason is not None:
        run_slurm(["scontrol", "update", f"nodename={node}", "state=down", f"reason={mark_down_reason}"],
                  env=cluster.env, timeout_s=15)
    return [p.pid for p in targets + extra]


def revive_node(cluster: Cluster, node: str, *, wait_idle_s: float = 30.0) -> Cluster:
    """Start ``node``'s slurmd again (after :func:`kill_node`) and wait until the node is ``idle``.

    ReturnToService=2 returns a DOWN node to service when its slurmd registers. Records the new PID in
    ``cluster.json``. Raises :class:`ClusterError` if the node is still running or does not come back.
    """
    cluster.switch_of(node)
    key = f"slurmd:{node}"
    if key in cluster.daemons and _procs.is_alive(cluster.daemons[key]):
        raise ClusterError(f"node={node!r}: its slurmd (pid {cluster.daemons[key].pid}) still runs")
    cluster.daemons[key] = _start_slurmd(cluster.run_dir, node)
    cluster.save()
    _wait_for(f"node {node} idle", lambda: _nodes_in(cluster, [node], {"idle"}), cluster, [key], wait_idle_s)
    return cluster


def wait_node_state(cluster: Cluster, node: str, states: set[str], timeout_s: float,
                    poll_s: float = 0.5) -> str:
    """Wait until ``node``'s sinfo state is one of ``states``; returns it. Raises ClusterError on timeout."""
    deadline = time.monotonic() + timeout_s
    last = "?"
    while True:
        try:
            last = node_states(cluster).get(node, {}).get("state", "?")
        except SlurmError:
            pass
        if last in states:
            return last
        if time.monotonic() >= deadline:
            raise ClusterError(f"node {node} is {last!r}, not in {sorted(states)} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def parse_topology(text: str) -> list[dict[str, str]]:
    """Parse ``scontrol show topology`` lines (``SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=...``)."""
    out = []
    for line in text.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if "SwitchName" in fields:
            out.append(fields)
    return out


def status(cluster: Cluster) -> dict:
    """The cluster's state for humans and scripts: daemons (alive or not), nodes (sinfo state, switch,
    port), switches (``scontrol show topology``). Node and switch data are empty when slurmctld is down."""
    alive = cluster.alive_daemons()
    daemons = [{"name": name, "pid": p.pid, "alive": name in alive} for name, p in cluster.daemons.items()]
    states: dict[str, dict[str, str]] = {}
    switches: list[dict[str, str]] = []
    error = None
    if "slurmctld" in alive:
        try:
            states = node_states(cluster)
            switches = parse_topology(run_slurm(["scontrol", "show", "topology"], env=cluster.env,
                                                timeout_s=10).stdout)
        except SlurmError as exc:
            error = str(exc)
    nodes = [{"name": n, "state": states.get(n, {}).get("state", "unknown"),
              "reason": states.get(n, {}).get("reason", ""), "switch": cluster.switch_of(n),
              "port": cluster.node_ports[n], "slurmd_alive": f"slurmd:{n}" in alive} for n in cluster.nodes]
    return {"run_dir": str(cluster.run_dir), "state": cluster.state if alive else "stopped",
            "slurm_conf": str(cluster.slurm_conf), "env": cluster.env, "ctld_port": cluster.ctld_port,
            "daemons": daemons, "nodes": nodes, "switches": switches, "error": error}


# -------------------------------------------------------------------------------------------- down


def _stop_all(cluster: Cluster, timeout_s: float = 10.0) -> list[str]:
    """Stop jobs' processes, every slurmd, slurmctld and munged of ``cluster``, by recorded PID.

    Returns names of processes that survived SIGKILL (empty on success).
    """
    slurmds = [p for name, p in cluster.daemons.items() if name.startswith("slurmd:")]
    left = _procs.stop_procs(slurmds, term_timeout_s=timeout_s)
    # slurmstepd outlive their slurmd; they and their tasks belong to this cluster (marker variables).
    left += _procs.stop_procs(_node_procs(cluster, None), term_timeout_s=2.0)
    left += _procs.stop_procs([p for n, p in cluster.daemons.items() if n == "slurmctld"], term_timeout_s=timeout_s)
    left += _procs.stop_procs([p for n, p in cluster.daemons.items() if n == "munged"], term_timeout_s=timeout_s)
    names = {p: n for n, p in cluster.daemons.items()}
    return [names.get(p, f"pid {p.pid}") for p in left]


def down(run_dir: Path | str | None = None, *, timeout_s: float = 10.0) -> dict:
    """Stop the cluster recorded in ``run_dir``: cancel its jobs, then stop its daemons by recorded PID.

    Returns ``{"run_dir", "stopped": [names], "already_gone": [names]}``. Raises :class:`ClusterError`
    when there is no cluster there or a process survives SIGKILL. Files stay (logs are useful); the next
    ``up`` in the same run directory clears them.
    """
    cluster = load_cluster(run_dir)
    alive = cluster.alive_daemons()
    if "slurmctld" in alive and "munged" in alive:
        try:
            jobs = run_slurm(["squeue", "--noheader", "--format=%A"], env=cluster.env, timeout_s=10,
                             check=False).stdout.split()
            if jobs:
                run_slurm(["scancel", *jobs], env=cluster.env, timeout_s=10, check=False)
                deadline = time.monotonic() + 5
                while node_step_daemons(cluster) and time.monotonic() < deadline:
                    time.sleep(0.2)
        except SlurmError:
            pass  # stopping the daemons below ends the jobs anyway
    survivors = _stop_all(cluster, timeout_s=timeout_s)
    if survivors:
        raise ClusterError(f"could not stop {', '.join(survivors)} of the cluster in {cluster.run_dir}")
    cluster.state = "stopped"
    cluster.save()
    _ports.release_ports(cluster.run_dir)
    return {"run_dir": str(cluster.run_dir), "stopped": sorted(alive),
            "already_gone": sorted(set(cluster.daemons) - set(alive))}
