"""The GPU check's runner on CPU: a result kept when the check's process hangs at exit, a report written when
an import fails, the code version every report names."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from phoenix_hpc.gpucheck import env, report
from phoenix_hpc.gpucheck import run as R

HANG_AFTER_RESULT = r"""
import json, sys, time
open(sys.argv[-1], "w").write(json.dumps([{"name": "nccl.create_abort_create", "status": "passed", "reason": "",
                                          "numbers": {"abort_ms": 1.0}, "limit": ""}]))
time.sleep(120)  # as a process stuck in NCCL's or CUDA's teardown
"""


def test_wait_check_kills_a_process_that_hangs_after_its_result(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "EXIT_GRACE_S", 0.5)
    result = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-c", HANG_AFTER_RESULT, str(result)])
    t0 = time.perf_counter()
    assert R.wait_check(proc, result, time.perf_counter() + 60, poll_s=0.1) == (None, "exit")
    assert time.perf_counter() - t0 < 30 and proc.returncode is not None
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert R.wait_check(proc, tmp_path / "none.json", time.perf_counter() + 0.3, poll_s=0.1) == (None, "timeout")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert R.wait_check(proc, tmp_path / "none.json", time.perf_counter() + 60, poll_s=0.1) == (3, "")


def test_run_check_keeps_the_result_of_a_process_that_hung_at_exit(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "EXIT_GRACE_S", 0.5)
    real = subprocess.Popen

    def fake(cmd, **kw):  # the check's command replaced by one that writes its result, then hangs
        return real([sys.executable, "-c", HANG_AFTER_RESULT, cmd[-1]], **kw)

    monkeypatch.setattr(R.subprocess, "Popen", fake)
    got = R.run_check("nccl", tmp_path, 60.0)
    first, second = got["items"]
    assert first["status"] == "passed" and first["numbers"] == {"abort_ms": 1.0}
    assert "kept: the check's process hung after writing its result" in first["reason"]
    assert second["name"] == "nccl.generation_abort" and second["status"] == "failed"


def test_a_failed_import_is_listed_and_the_report_still_written(tmp_path, monkeypatch):
    real = R.importlib.import_module

    def broken(name, *a, **k):
        if name == "yaml":
            raise ImportError("No module named 'yaml'")
        return real(name, *a, **k)

    monkeypatch.setattr(R.importlib, "import_module", broken)
    lines, ok = R._import_wheels()
    assert not ok and "import failed: yaml: ImportError: No module named 'yaml'" in lines
    assert [ln.split()[1] for ln in lines if ln.startswith("imported ")] == [
        n for n in R.WHEEL_IMPORTS + R.HOST_IMPORTS if n != "yaml"]
    monkeypatch.setattr(env, "device_facts", lambda: {"name": "none (CPU test)"})
    monkeypatch.setattr(R, "run_check", lambda name, out, t: {"check": name, "wall_s": 0, "timeout_s": 1,
                                                              "items": [report.item(f"{name}.x", "passed")]})
    assert R.gpu_run(tmp_path, ["nccl"], 100.0) == 1
    rep = json.loads((tmp_path / "gpu-report.json").read_text())
    imports = next(c for c in rep["checks"] if c["check"] == "preparation")["items"][0]
    assert imports["name"] == "gpu.imports" and imports["status"] == "failed" and "yaml" in imports["reason"]
    assert rep["code"]["commit"] and "import failed: yaml" in " ".join(rep["preparation"])


def test_code_version_names_a_commit_or_says_why_not_and_digests_the_code(tmp_path):
    (tmp_path / "phoenix_hpc").mkdir()
    (tmp_path / "phoenix_hpc" / "a.py").write_text("x = 1\n")
    (tmp_path / "phoenix_hpc" / "__pycache__").mkdir()
    (tmp_path / "phoenix_hpc" / "__pycache__" / "a.pyc").write_bytes(b"junk")
    d1 = env.source_digest(tmp_path)
    (tmp_path / "phoenix_hpc" / "__pycache__" / "a.pyc").write_bytes(b"other")
    assert env.source_digest(tmp_path) == d1
    (tmp_path / "phoenix_hpc" / "a.py").write_text("x = 2\n")
    assert env.source_digest(tmp_path) != d1
    v = env.code_version(tmp_path, environ={})
    assert v["commit"].startswith("unknown: no git checkout here") and v["source_digest"] == env.source_digest(tmp_path)
    assert env.code_version(tmp_path, environ={env.COMMIT_ENV: "abc123"})["commit"] == "abc123"
    if (R.ROOT / ".git").exists():  # a checkout: its commit
        assert len(env.code_version(R.ROOT)["commit"].split("+")[0]) == 40
