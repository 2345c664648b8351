"""``scripts/gpu-check.sh --dry-run`` from this checkout: the wheels of ``.whl/`` (fetched by
``scripts/gpu-wheels.sh`` when missing, which needs the package index) are checked and installed without
network, every check is imported and planned, and the report lists every item. No GPU, no cluster.

The dry run installs the wheels for CPython 3.12 / x86-64; on another interpreter it does not import them
(the report's preparation says so) -- the imports then use the test interpreter's copies of the same pinned
versions (tests/unit/test_gpucheck.py checks that they are the same), but for megatron-core, which travels at
the newest release the engine claims (0.19.2, Python 3.12 only; its names are checked against that wheel's
source by tests/unit/test_megatron_source.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from phoenix_hpc.gpucheck import CHECKS, wheels
from phoenix_hpc.gpucheck.run import HOST_IMPORTS, WHEEL_IMPORTS, check_module

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, timeout, **env):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PHOENIX_GPU_PYTHON": sys.executable, "PYTHON": sys.executable, **env})


def _ensure_wheels() -> None:
    if _run([sys.executable, "-m", "phoenix_hpc.gpucheck.wheels", "check", ".whl"], 60).returncode == 0:
        return
    r = _run([str(ROOT / "scripts" / "gpu-wheels.sh")], 900)
    assert r.returncode == 0, f"scripts/gpu-wheels.sh failed (it needs the package index):\n{r.stderr[-3000:]}"
    assert "wheels in .whl/" in r.stdout


def test_dry_run_installs_the_wheels_and_plans_every_check(tmp_path):
    _ensure_wheels()
    out = tmp_path / "out"
    r = _run([str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run", str(out)], 600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads((out / "gpu-report.json").read_text())
    assert rep["mode"] == "dry-run" and rep["summary"]["failed"] == 0
    assert [c["check"] for c in rep["checks"]] == list(CHECKS)
    for c in rep["checks"]:
        assert [i["name"] for i in c["items"]] == list(check_module(c["check"]).ITEMS)
        assert all(i["status"] == "skipped" and i["reason"].startswith("dry run (planned: ") for i in c["items"])
    prep = rep["preparation"]
    assert prep[0].startswith(f"installed {len(wheels.GPU_MISSING)} wheels from .whl/ without network")
    assert [p.split()[1] for p in prep if p.startswith("imported ")] == list(WHEEL_IMPORTS + HOST_IMPORTS)
    md = (out / "gpu-report.md").read_text()
    assert "| megatron | megatron.rebuild | **skipped** | dry run" in md
    assert rep["code"]["commit"] and len(rep["code"]["source_digest"]) == 16 and "| commit | " in md
    cases = next(c for c in rep["checks"] if c["check"] == "cases")
    planned = json.loads(cases["items"][0]["reason"][len("dry run (planned: "):-1])
    for name in ("d2h.perlmutter_7b", "d2h.vista_7b"):  # from the examples by the memory estimate
        assert 1e8 < planned[name]["bytes_per_step_s"] < 1e9, planned[name]
    assert planned["variants"]["one_connection"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_missing_and_wrong_platform_wheels_are_named_with_the_fetch_command(tmp_path):
    _ensure_wheels()
    whl = tmp_path / "whl"
    whl.mkdir()
    for f in (ROOT / ".whl").glob("*.whl"):
        if not f.name.startswith(("megatron_core-", "pydantic-")):
            shutil.copy(f, whl)
    pins = dict(wheels.read_pins(ROOT / "pyproject.toml"))
    mac = f"megatron_core-{pins['megatron-core']}-cp312-cp312-macosx_11_0_arm64.whl"  # the right version, wrong platform
    (whl / mac).write_bytes(b"")
    r = _run([str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run", str(tmp_path / "out")], 120,
             PHOENIX_GPU_WHEELS=str(whl))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"megatron-core=={pins['megatron-core']}: no wheel for CPython 3.12 on manylinux x86-64 "
            f"({mac}); fetch it with scripts/gpu-wheels.sh") in r.stderr
    assert f"pydantic=={pins['pydantic']}: no wheel; fetch it with scripts/gpu-wheels.sh" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
