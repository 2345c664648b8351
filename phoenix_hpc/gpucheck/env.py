"""Versions and device facts for the GPU report; the host link's bandwidth limit.

The parsing and the link arithmetic are pure; :func:`versions` and :func:`device_facts` read the machine
(``device_facts`` makes CUDA calls, so the dry run does not call it).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

#: PCIe transfer rate per lane (GT/s) and line-code efficiency, by generation (PCI-SIG base specifications
#: 1.0-6.0: 8b/10b for 1-2, 128b/130b for 3-5; 6.0's FLIT mode carries 242 payload bytes per 256).
PCIE_GEN = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130),
            6: (64.0, 242 / 256)}

SMI_FIELDS = ("driver_version", "pcie.link.gen.max", "pcie.link.width.max", "pcie.link.gen.current",
              "pcie.link.width.current")


def link_limit_gbs(gen: int, width: int) -> float:
    """One direction's raw PCIe bandwidth in GB/s (1e9 bytes/s): ``GT/s x lanes x code efficiency / 8``.
    Packet headers lower what a copy reaches by a further few percent.

    Raises:
        ValueError: an unknown generation or a width below 1.
    """
    if gen not in PCIE_GEN or width < 1:
        raise ValueError(f"PCIe gen {gen} x{width}: gen must be one of {sorted(PCIE_GEN)}, width >= 1")
    rate, eff = PCIE_GEN[gen]
    return rate * width * eff / 8


def parse_smi_csv(text: str) -> dict[str, str]:
    """First GPU's line of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``, as a dict
    (values stripped; ``[N/A]`` and missing become absent)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    vals = [v.strip() for v in line.split(",")]
    return {k: v for k, v in zip(SMI_FIELDS, vals) if v and not v.startswith("[")}


def pcie_facts(smi: dict[str, str]) -> dict[str, Any]:
    """Link generation/width (max and current) and the limit of the max link, from :func:`parse_smi_csv`'s
    dict; empty when nvidia-smi gave no link fields."""
    try:
        gen, width = int(smi["pcie.link.gen.max"]), int(smi["pcie.link.width.max"])
    except (KeyError, ValueError):
        return {}
    out: dict[str, Any] = {"gen_max": gen, "width_max": width}
    try:
        out["limit_gbs"] = round(link_limit_gbs(gen, width), 1)
    except ValueError:
        pass
    for k in ("gen.current", "width.current"):
        if f"pcie.link.{k}" in smi:
            out[k.replace(".", "_")] = smi[f"pcie.link.{k}"]
    return out


def nvidia_smi() -> dict[str, str]:
    """:func:`parse_smi_csv` of ``nvidia-smi``; empty when it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        r = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_smi_csv(r.stdout) if r.returncode == 0 else {}


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def versions(with_cuda: bool) -> dict[str, str]:
    """Python, torch, CUDA (torch's build), megatron-core, pydantic; with ``with_cuda`` also the driver
    (nvidia-smi) and NCCL (torch's build)."""
    import platform

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
           "megatron_core": _dist_version("megatron-core"), "pydantic": _dist_version("pydantic")}
    if with_cuda:
        out["driver"] = nvidia_smi().get("driver_version", "unknown (no nvidia-smi)")
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except (AttributeError, RuntimeError, TypeError):
            out["nccl"] = "unknown"
    return out


def device_facts() -> dict[str, Any]:
    """Name, memory (GiB), compute capability of CUDA device 0 and its PCIe link (CUDA calls)."""
    import torch

    p = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                           "capability": f"{p.major}.{p.minor}", "count": torch.cuda.device_count()}
    pcie = pcie_facts(nvidia_smi())
    if pcie:
        out["pcie"] = pcie
    return out


#: set it where the checkout has no ``.git`` (a copy of the working tree): the commit the copy was made from
COMMIT_ENV = "PHOENIX_GPU_COMMIT"
#: what :func:`source_digest` covers, relative to the repository
DIGEST_PATHS = ("phoenix_hpc", "scripts", "examples", "pyproject.toml")


def source_digest(root) -> str:
    """SHA-256 (first 16 hex digits) of the project's code under ``root`` (:data:`DIGEST_PATHS`: every
    file's path and bytes, in path order; ``__pycache__`` and ``*.pyc`` left out): the same for a checkout
    of a commit and any copy of its files, so a report from a machine without git can be matched to its
    commit (``python -m phoenix_hpc.gpucheck.env digest [ROOT]`` in a checkout of that commit)."""
    import hashlib
    from pathlib import Path

    root = Path(root)
    h = hashlib.sha256()
    files = []
    for p in DIGEST_PATHS:
        q = root / p
        files += [q] if q.is_file() else sorted(f for f in q.rglob("*") if f.is_file()) if q.is_dir() else []
    for f in sorted(files):
        rel = f.relative_to(root).as_posix()
        if "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def code_version(root, environ=None) -> dict[str, str]:
    """What code a report measured: ``commit`` (``git rev-parse HEAD`` of ``root``, with ``+changes`` when
    ``git status --porcelain`` lists changed tracked files; else :data:`COMMIT_ENV`; else a sentence saying it
    is unknown) and ``source_digest`` (:func:`source_digest`, always)."""
    import os

    environ = os.environ if environ is None else environ
    commit = ""
    git = shutil.which("git")
    if git is not None:
        try:
            r = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                commit = r.stdout.strip()
                d = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30)
                if d.returncode == 0 and d.stdout.strip():
                    commit += "+changes"
        except (OSError, subprocess.TimeoutExpired):
            commit = ""
    if not commit:
        commit = environ.get(COMMIT_ENV, "") or (f"unknown: no git checkout here and {COMMIT_ENV} unset; match "
                                                 "source_digest against a checkout")
    return {"commit": commit, "source_digest": source_digest(root)}


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if sys.argv[1:2] == ["digest"] and len(sys.argv) <= 3:
        print(source_digest(Path(sys.argv[2]) if len(sys.argv) == 3 else Path(__file__).resolve().parents[2]))
        sys.exit(0)
    print("usage: python -m phoenix_hpc.gpucheck.env digest [ROOT]", file=sys.stderr)
    sys.exit(2)
