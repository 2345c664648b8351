"""Pure description and config rendering of the local test cluster.

Everything here is a pure function of its arguments: the layout of a cluster (node names, switches, ports,
paths under the run directory) and the text of its ``slurm.conf``, ``topology.conf``, ``gres.conf`` and
per-node ``mpi.conf``. Starting daemons lives in :mod:`phoenix_hpc.slurm.cluster`.

The config templates are assets in the repository's top-level ``slurm/local-cluster/`` folder
(``*.conf.tmpl``, :class:`string.Template` syntax); :func:`load_templates` reads them and
:func:`render_configs` fills them in.

Option meanings: slurm.conf(5), topology.conf(5), gres.conf(5), mpi.conf(5) of Slurm 22.05.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import hostlist

from phoenix_hpc.errors import ClusterError

#: Template files (name of the rendered file -> template file name) under ``slurm/local-cluster/``.
TEMPLATE_FILES: dict[str, str] = {
    "slurm.conf": "slurm.conf.tmpl",
    "topology.conf": "topology.conf.tmpl",
    "gres.conf": "gres.conf.tmpl",
    "mpi.conf": "mpi.conf.tmpl",
}

#: Node names look like Cray/HPE ``nid`` names: ``nid00001``, ``nid00002`` ...
NODE_PREFIX = "nid"
NODE_DIGITS = 5

MAX_NODES = 64
MAX_GPUS_PER_NODE = 16
MAX_CPUS_PER_NODE = 256
# Unix socket paths are limited to 108 bytes (sun_path). The longest socket this cluster creates is a
# slurmstepd socket ``<run_dir>/nodes/<node>/spool/<node>_<jobid>.<stepid>`` (about 50 characters after
# the run directory), and PMIx adds its own names under the per-node PMIx directory; 60 characters of run
# directory leave room for both.
MAX_RUN_DIR_CHARS = 60


@dataclass(frozen=True)
class ClusterLayout:
    """Everything needed to render the configs of one local cluster.

    ``ctld_port`` and ``node_ports`` are TCP ports on 127.0.0.1 (``node_ports[i]`` belongs to ``nodes[i]``);
    ``switches`` maps each leaf switch name to the node names under it, in order; ``spine`` joins the leaves.
    ``slurmd_timeout_s`` is slurm.conf's ``SlurmdTimeout`` (seconds until a silent node is marked DOWN),
    ``message_timeout_s`` its ``MessageTimeout`` (seconds an RPC may take; also how long a ping of a dead
    slurmd takes to fail, so both set how fast a killed node is marked DOWN).
    """

    run_dir: Path
    cluster_name: str
    ctld_host: str
    ctld_port: int
    nodes: tuple[str, ...]
    node_ports: tuple[int, ...]
    switches: tuple[tuple[str, tuple[str, ...]], ...]
    spine: str
    gpus_per_node: int
    cpus_per_node: int
    real_memory_mb: int
    slurmd_timeout_s: int
    message_timeout_s: int = 5
    partition: str = "batch"

    # Paths under the run directory (one place defines the layout of the run directory).
    @property
    def etc_dir(self) -> Path:
        """Folder of the configs that Slurm *commands* read (``SLURM_CONF`` points into it)."""
        return self.run_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def munge_dir(self) -> Path:
        return self.run_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munged.socket"

    @property
    def ctld_dir(self) -> Path:
        return self.run_dir / "ctld"

    @property
    def nodes_dir(self) -> Path:
        return self.run_dir / "nodes"

    def node_dir(self, node: str) -> Path:
        return self.nodes_dir / node

    def node_etc_dir(self, node: str) -> Path:
        """Per-node config folder: the same slurm.conf plus this node's own ``mpi.conf``."""
        return self.node_dir(node) / "etc"

    def node_gpu_files(self, node: str) -> tuple[Path, ...]:
        """The empty files that stand in for this node's GPU devices (``nvidia0`` ...)."""
        return tuple(self.node_dir(node) / "dev" / f"nvidia{i}" for i in range(self.gpus_per_node))

    def node_pmix_dir(self, node: str) -> Path:
        return self.node_dir(node) / "pmix"

    def switch_of(self, node: str) -> str:
        for leaf, members in self.switches:
            if node in members:
                return leaf
        raise KeyError(node)


def node_names(count: int, first: int = 1) -> tuple[str, ...]:
    """``count`` node names ``nid00001``, ``nid00002``, ... starting at number ``first``."""
    return tuple(f"{NODE_PREFIX}{i:0{NODE_DIGITS}d}" for i in range(first, first + count))


def split_nodes(nodes: tuple[str, ...], switches: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Split ``nodes`` into ``switches`` contiguous blocks (sizes differ by at most one), one per leaf.

    Leaves are named ``leaf0``, ``leaf1`` ...; earlier leaves get the extra node when the split is uneven.
    Raises :class:`ClusterError` when ``switches`` is not in ``1..len(nodes)``.
    """
    if not 1 <= switches <= len(nodes):
        raise ClusterError(f"switches={switches}: must be between 1 and the number of nodes ({len(nodes)})")
    base, extra = divmod(len(nodes), switches)
    out, start = [], 0
    for i in range(switches):
        size = base + (1 if i < extra else 0)
        out.append((f"leaf{i}", tuple(nodes[start:start + size])))
        start += size
    return tuple(out)


def validate_request(nodes: int, switches: int, gpus_per_node: int, cpus_per_node: int, run_dir: Path,
                     slurmd_timeout_s: int = 5, message_timeout_s: int = 5) -> list[str]:
    """Every problem with a ``cluster up`` request, one message each (empty list: valid)."""
    problems = []
    if not 2 <= slurmd_timeout_s <= 3600:
        problems.append(f"slurmd_timeout_s={slurmd_timeout_s}: must be between 2 and 3600")
    if not 1 <= message_timeout_s <= 100:
        problems.append(f"message_timeout_s={message_timeout_s}: must be between 1 and 100")
    if not 1 <= nodes <= MAX_NODES:
        problems.append(f"nodes={nodes}: must be between 1 and {MAX_NODES}")
    if not 1 <= switches <= max(1, nodes):
        problems.append(f"switches={switches}: must be between 1 and the number of nodes ({nodes})")
    if not 0 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        problems.append(f"gpus_per_node={gpus_per_node}: must be between 0 and {MAX_GPUS_PER_NODE}")
    if not 1 <= cpus_per_node <= MAX_CPUS_PER_NODE:
        problems.append(f"cpus_per_node={cpus_per_node}: must be between 1 and {MAX_CPUS_PER_NODE}")
    if len(str(run_dir)) > MAX_RUN_DIR_CHARS:
        problems.append(
            f"run_dir={str(run_dir)!r}: {len(str(run_dir))} characters; at most {MAX_RUN_DIR_CHARS} "
            "(Unix socket paths under it are limited to 108 bytes), pick a shorter directory")
    if any(c.isspace() or c in "\"'#=,;$`\\" for c in str(run_dir)):
        problems.append(f"run_dir={str(run_dir)!r}: must not contain spaces, quotes or any of # = , ; $ ` \\ "
                        "(the path is written into slurm.conf, which has no quoting)")
    return problems


def make_layout(*, run_dir: Path, ctld_host: str, ctld_port: int, node_ports: tuple[int, ...],
                nodes: int, switches: int, gpus_per_node: int, cpus_per_node: int = 8,
                real_memory_mb: int = 8192, slurmd_timeout_s: int = 5, message_timeout_s: int = 5,
                cluster_name: str = "phoenix") -> ClusterLayout:
    """Build and validate a :class:`ClusterLayout`. Raises :class:`ClusterError` listing every problem."""
    problems = validate_request(nodes, switches, gpus_per_node, cpus_per_node, run_dir, slurmd_timeout_s,
                                message_timeout_s)
    if len(node_ports) != nodes:
        problems.append(f"node_ports: {len(node_ports)} ports for {nodes} nodes")
    ports = (ctld_port, *node_ports)
    if len(set(ports)) != len(ports):
        problems.append(f"ports {ports}: must all differ")
    if problems:
        raise ClusterError("cannot build the local cluster:\n" + "\n".join(f"  - {p}" for p in problems))
    names = node_names(nodes)
    return ClusterLayout(
        run_dir=run_dir, cluster_name=cluster_name, ctld_host=ctld_host, ctld_port=ctld_port,
        nodes=names, node_ports=tuple(node_ports), switches=split_nodes(names, switches), spine="spine",
        gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node, real_memory_mb=real_memory_mb,
        slurmd_timeout_s=slurmd_timeout_s, message_timeout_s=message_timeout_s)


def _fill(template: str, name: str, values: Mapping[str, object]) -> str:
    try:
        return string.Template(template).substitute({k: str(v) for k, v in values.items()})
    except (KeyError, ValueError) as exc:
        raise ClusterError(f"template {name}: cannot fill placeholder {exc}") from exc


def node_line(layout: ClusterLayout, node: str, port: int) -> str:
    """The ``NodeName=`` line of one node: 127.0.0.1 plus its own slurmd port, fake GPUs as gres."""
    parts = [f"NodeName={node}", f"NodeHostname={layout.ctld_host}", "NodeAddr=127.0.0.1", f"Port={port}",
             f"CPUs={layout.cpus_per_node}", f"RealMemory={layout.real_memory_mb}"]
    if layout.gpus_per_node:
        parts += [f"Gres=gpu:{layout.gpus_per_node}", "Feature=gpu"]
    parts.append("State=UNKNOWN")
    return " ".join(parts)


def render_configs(layout: ClusterLayout, templates: Mapping[str, str]) -> dict[str, str]:
    """Text of ``slurm.conf``, ``topology.conf`` and ``gres.conf`` (shared by all daemons and commands).

    ``templates`` maps each name of :data:`TEMPLATE_FILES` to its template text. Returns file name -> text.
    """
    run = layout.run_dir
    slurm = _fill(templates["slurm.conf"], "slurm.conf", {
        "node_count": len(layout.nodes),
        "cluster_name": layout.cluster_name,
        "ctld_host": layout.ctld_host,
        "ctld_port": layout.ctld_port,
        "munge_socket": layout.munge_socket,
        "ctld_state_dir": layout.ctld_dir / "state",
        "ctld_pid_file": layout.ctld_dir / "slurmctld.pid",
        "ctld_log_file": layout.ctld_dir / "slurmctld.log",
        "nodes_dir": run / "nodes",
        "slurmd_timeout_s": layout.slurmd_timeout_s,
        "message_timeout_s": layout.message_timeout_s,
        "partition": layout.partition,
        "node_lines": "\n".join(node_line(layout, n, p) for n, p in zip(layout.nodes, layout.node_ports)),
    })
    switch_lines = [f"SwitchName={leaf} Nodes={hostlist.collect_hostlist(list(members))}"
                    for leaf, members in layout.switches]
    leaves = hostlist.collect_hostlist([leaf for leaf, _ in layout.switches])
    switch_lines.append(f"SwitchName={layout.spine} Switches={leaves}")
    topology = _fill(templates["topology.conf"], "topology.conf", {"switch_lines": "\n".join(switch_lines)})
    gres_lines = []
    if layout.gpus_per_node:
        for node in layout.nodes:
            gpu_dir = layout.node_dir(node) / "dev"
            files = f"{gpu_dir}/nvidia[0-{layout.gpus_per_node - 1}]" if layout.gpus_per_node > 1 \
                else f"{gpu_dir}/nvidia0"
            gres_lines.append(f"NodeName={node} Name=gpu File={files}")
    gres = _fill(templates["gres.conf"], "gres.conf", {"gres_lines": "\n".join(gres_lines)})
    return {"slurm.conf": slurm, "topology.conf": topology, "gres.conf": gres}


def render_mpi_conf(layout: ClusterLayout, node: str, templates: Mapping[str, str]) -> str:
    """Text of ``node``'s own ``mpi.conf``: ``PMIxCliTmpDirBase`` set to the node's PMIx directory."""
    return _fill(templates["mpi.conf"], "mpi.conf", {"node": node, "pmix_tmp_dir": layout.node_pmix_dir(node)})


def default_template_dir() -> Path:
    """``slurm/local-cluster/`` of the repository this package lives in."""
    return Path(__file__).resolve().parents[2] / "slurm" / "local-cluster"


def load_templates(template_dir: Path | None = None) -> dict[str, str]:
    """Read the templates of :data:`TEMPLATE_FILES`. Raises :class:`ClusterError` when one is missing."""
    folder = template_dir or default_template_dir()
    out, missing = {}, []
    for name, file in TEMPLATE_FILES.items():
        path = folder / file
        try:
            out[name] = path.read_text()
        except OSError:
            missing.append(str(path))
    if missing:
        raise ClusterError("missing local-cluster config templates: " + ", ".join(missing)
                           + " (they ship in the repository's slurm/local-cluster/ folder)")
    return out
