"""The wheels a bare GPU machine needs, and the check that ``.whl/`` holds them.

The GPU machine the check is written for (Python 3.12, x86-64, torch with CUDA, no network) lacks the
packages in :data:`GPU_MISSING`. Their versions are the exact pins of ``pyproject.toml``'s dependencies
(one source: ``scripts/gpu-wheels.sh`` fetches what :func:`gpu_pins` lists), except those in
:data:`GPU_VERSIONS`: megatron-core there is the newest release the engine claims
(:data:`phoenix_hpc.engines.megatron_version.NEWEST_CHECKED`, which needs Python 3.12), so that the GPU check
runs the Megatron items on it while the CPU tests run the pinned one. A wheel matches when its
name and version are the pin's and its tags run on CPython 3.12 / manylinux x86-64 (or it is pure Python).

CLI (used by the scripts; no torch import)::

    python -m phoenix_hpc.gpucheck.wheels pins                 # NAME==VERSION per line
    python -m phoenix_hpc.gpucheck.wheels check .whl           # exit 2 naming each missing/wrong wheel
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: Distributions the GPU machine lacks: the project's own dependencies and theirs (pydantic's). Its
#: typing-extensions (there for torch) travels too: pydantic-core imports ``typing_extensions.Sentinel``
#: (4.14.1 or newer), which a torch install's copy may predate; newer versions keep every older name.
GPU_MISSING = ("megatron-core", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
               "python-hostlist", "typing-extensions", "xxhash", "crc32c", "psutil")
PYTHON_TAG, ABI_TAG = "cp312", "cp312"


def gpu_versions() -> dict[str, str]:
    """Packages whose GPU-machine version is not ``pyproject.toml``'s pin: megatron-core at
    :data:`~phoenix_hpc.engines.megatron_version.NEWEST_CHECKED` (same dependencies as the pinned release:
    torch, numpy, packaging)."""
    from phoenix_hpc.engines.megatron_version import NEWEST_CHECKED

    return {"megatron-core": NEWEST_CHECKED}
FETCH = "scripts/gpu-wheels.sh"  # the command that fetches them (needs the package index)

_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")


def canonical(name: str) -> str:
    """PEP 503 normalised name: lower case, runs of ``-_.`` become ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_pins(dependencies: list[str], names: tuple[str, ...] = GPU_MISSING) -> list[tuple[str, str]]:
    """``(name, version)`` of each of ``names`` from ``pyproject``'s ``project.dependencies`` strings.

    Raises:
        ValueError: a name is not among the dependencies, or is not pinned with ``==``.
    """
    found: dict[str, str] = {}
    loose: dict[str, str] = {}
    for dep in dependencies:
        m = _PIN.match(dep)
        if m:
            found[canonical(m.group(1))] = m.group(2)
        else:
            loose[canonical(re.split(r"[<>=!~;\[ ]", dep.strip(), maxsplit=1)[0])] = dep
    out = []
    for n in names:
        c = canonical(n)
        if c in found:
            out.append((n, found[c]))
        elif c in loose:
            raise ValueError(f"pyproject.toml dependency {loose[c]!r}: the GPU wheels need an exact pin (NAME==VERSION)")
        else:
            raise ValueError(f"pyproject.toml has no dependency {n!r} (the GPU wheels need {n}==VERSION)")
    return out


def read_pins(pyproject: Path) -> list[tuple[str, str]]:
    """:func:`gpu_pins` of the ``pyproject.toml`` at ``pyproject``, with :func:`gpu_versions` applied."""
    import tomllib

    with open(pyproject, "rb") as f:
        pins = gpu_pins(list(tomllib.load(f)["project"]["dependencies"]))
    over = {canonical(k): v for k, v in gpu_versions().items()}
    return [(n, over.get(canonical(n), v)) for n, v in pins]


def parse_wheel_name(filename: str) -> tuple[str, str, str, str, str] | None:
    """``(name, version, python tag, abi tag, platform tag)`` of a wheel file name (PEP 427), or None."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) == 6:  # with a build tag
        parts = parts[:2] + parts[3:]
    if len(parts) != 5:
        return None
    return parts[0], parts[1], parts[2], parts[3], parts[4]


def tags_fit(py: str, abi: str, plat: str) -> bool:
    """Whether a wheel's tags run on CPython 3.12 / Linux x86-64 with glibc (manylinux) -- or anywhere.
    A stable-ABI wheel (``abi3``, PEP 384) built for CPython 3.N runs on every CPython from 3.N on
    (e.g. psutil's ``cp36-abi3``)."""
    pys, abis, plats = py.split("."), abi.split("."), plat.split(".")
    if "none" in abis and "any" in plats:
        return any(p in ("py3", "py312", PYTHON_TAG) for p in pys)
    stable = "abi3" in abis and any(re.fullmatch(r"cp3(\d+)", p) and int(p[3:]) <= int(PYTHON_TAG[3:])
                                    for p in pys)
    return ((PYTHON_TAG in pys and (ABI_TAG in abis or "abi3" in abis)) or stable) \
        and any(p.startswith(("manylinux", "linux")) and p.endswith("x86_64") for p in plats)


def match_wheels(pins: list[tuple[str, str]], filenames: list[str]) -> tuple[list[str], list[str]]:
    """``(chosen wheel file per pin, problems)``. A problem names the package, what is wrong, the wheels
    seen for it, and the command that fetches the right one."""
    chosen, problems = [], []
    parsed = [(f, parse_wheel_name(f)) for f in sorted(filenames)]
    for name, ver in pins:
        same = [(f, p) for f, p in parsed if p and canonical(p[0]) == canonical(name)]
        fit = [f for f, p in same if p[1] == ver and tags_fit(p[2], p[3], p[4])]
        if fit:
            chosen.append(fit[0])
            continue
        if not same:
            why = "no wheel"
        elif not any(p[1] == ver for _, p in same):
            why = f"only other versions ({', '.join(f for f, _ in same)})"
        else:
            why = f"no wheel for CPython 3.12 on manylinux x86-64 ({', '.join(f for f, _ in same)})"
        problems.append(f"{name}=={ver}: {why}; fetch it with {FETCH} (on a machine with the package index)")
    return chosen, problems


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(__file__).resolve().parents[2]
    if args[:1] == ["pins"] and len(args) == 1:
        for n, v in read_pins(root / "pyproject.toml"):
            print(f"{n}=={v}")
        return 0
    if args[:1] == ["check"] and len(args) == 2:
        folder = Path(args[1])
        files = [p.name for p in folder.glob("*.whl")] if folder.is_dir() else []
        chosen, problems = match_wheels(read_pins(root / "pyproject.toml"), files)
        if problems:
            print(f"gpu-check: {folder}/ lacks wheels the GPU machine needs:", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
            return 2
        for f in chosen:
            print(folder / f)
        return 0
    print("usage: python -m phoenix_hpc.gpucheck.wheels pins | check FOLDER", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
