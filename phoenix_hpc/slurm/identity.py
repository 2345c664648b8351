"""Which Slurm cluster a command talks to: the ``slurm.conf`` its Slurm clients read and that file's
``ClusterName``.

Slurm's clients read the file named by ``SLURM_CONF``, else the one compiled in (``/etc/slurm/slurm.conf``
for Debian's packages), slurm.conf(5) "ENVIRONMENT"/"FILES". Two clusters on one machine (a checkout's local
cluster each) have their own file, so the pair tells them apart even where both are named alike; job ids
restart at 1 with every new cluster, so a job id alone does not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: slurm.conf when ``SLURM_CONF`` is not set (Debian 12's slurm-wlm packages).
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def slurm_conf_path(env: Mapping[str, str] | None = None) -> str:
    """The absolute, resolved path of the slurm.conf Slurm commands read with ``env`` (default: this
    process's environment)."""
    env = os.environ if env is None else env
    return str(Path(env.get("SLURM_CONF") or DEFAULT_SLURM_CONF).expanduser().resolve())


def cluster_name(conf_text: str) -> str | None:
    """``ClusterName`` of a slurm.conf text (keys are case-insensitive, slurm.conf(5); the last one wins);
    None when the file sets none. Pure."""
    name = None
    for line in conf_text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, eq, val = line.partition("=")
        if eq and key.strip().lower() == "clustername" and val.strip():
            name = val.strip().split()[0]
    return name


def cluster_identity(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``{"slurm_conf", "cluster"}`` of the cluster Slurm commands talk to with ``env``: the slurm.conf path
    (:func:`slurm_conf_path`) and its ``ClusterName`` (None when the file cannot be read or names none)."""
    path = slurm_conf_path(env)
    try:
        name = cluster_name(Path(path).read_text(errors="replace"))
    except OSError:
        name = None
    return {"slurm_conf": path, "cluster": name}
