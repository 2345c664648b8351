"""Run every GPU check and write ``OUT_DIR/gpu-report.json`` and ``OUT_DIR/gpu-report.md``.

::

    python -m phoenix_hpc.gpucheck.run [--dry-run] [--budget-s S] [--only NAME,...] [OUT_DIR]

Each check (:data:`phoenix_hpc.gpucheck.CHECKS`) runs in its own process (``--one``), so that a crash, a
hang or the global state of one (NCCL, Megatron's ``parallel_state``) cannot touch the next, under
``min(its TIMEOUT_S, what is left of --budget-s)``; its output goes to ``OUT_DIR/logs/NAME.log``.
``--dry-run`` makes no CUDA call: it imports every check and the packages of the wheels, builds every
check's config and dataset (``plan``), and writes a report whose items are all ``skipped``.

Exit codes: 0 no item failed; 1 an item failed (the report says which and why); 2 bad input or no CUDA
device (nothing is written).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from phoenix_hpc.gpucheck import CHECKS, report

#: Packages the wheels bring, by import name (distribution names in wheels.GPU_MISSING).
WHEEL_IMPORTS = ("megatron.core", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "hostlist",
                 "typing_extensions")
#: Packages the checks import that the GPU machine's interpreter must already have (not among the wheels),
#: imported in the dry run too, so that a missing one shows before a GPU is spent
HOST_IMPORTS = ("numpy", "scipy", "packaging", "yaml", "mpi4py.MPI")  # scipy: bench.stats' bootstrap interval
_DIST = {"megatron.core": "megatron-core", "hostlist": "python-hostlist", "yaml": "PyYAML", "mpi4py.MPI": "mpi4py"}
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUDGET_S = 450.0  # under the 8 minutes (480 s) the whole command may take, leaving 30 s for set-up
MIN_CHECK_S = 30.0  # budget kept for each check still to come (a process start, torch and CUDA set-up)


def check_module(name: str):
    """The module of check ``name``; raises ValueError when it lacks the interface."""
    mod = importlib.import_module(f"phoenix_hpc.gpucheck.check_{name}")
    missing = [a for a in ("NAME", "TIMEOUT_S", "ITEMS", "plan", "run") if not hasattr(mod, a)]
    if missing:
        raise ValueError(f"check module {mod.__name__} lacks {missing}")
    return mod


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _origin(mod) -> str:
    target = os.environ.get("PHOENIX_GPU_WHEEL_TARGET")
    f = str(getattr(mod, "__file__", "") or "")
    return "the wheels" if target and f.startswith(target) else "the interpreter's site-packages"


def _import_wheels() -> tuple[list[str], bool]:
    """Import every package of :data:`WHEEL_IMPORTS` and :data:`HOST_IMPORTS`: one line per package (its
    version and where it came from, or why it failed to import), and whether all imported."""
    import warnings
    from importlib.metadata import PackageNotFoundError, version

    out, ok = [], True
    for name in WHEEL_IMPORTS + HOST_IMPORTS:
        try:
            with warnings.catch_warnings():  # megatron-core warns that Transformer Engine and Apex are absent
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 -- an ImportError, or what the package raised while importing
            out.append(f"import failed: {name}: {type(e).__name__}: {str(e)[:200]}")
            ok = False
            continue
        try:
            v = version(_DIST.get(name, name.replace("_", "-")))
        except PackageNotFoundError:
            v = str(getattr(mod, "__version__", "(version unknown)"))
        out.append(f"imported {name} {v} from {_origin(mod)}")
    return out, ok


def dry_run(out: Path, names: list[str]) -> int:
    from phoenix_hpc.gpucheck import env

    t0, started = time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    work = out / "work"
    prep, checks, failed = [], [], False
    if os.environ.get("PHOENIX_GPU_WHEELS_NOTE"):
        prep.append(os.environ["PHOENIX_GPU_WHEELS_NOTE"])
    lines, ok = _import_wheels()
    prep += lines
    failed = not ok
    for name in names:
        c0 = time.perf_counter()
        try:
            mod = check_module(name)
            planned = mod.plan(work)
            items = [report.item(n, "skipped", f"dry run (planned: {json.dumps(planned, sort_keys=True)})")
                     for n in mod.ITEMS]
            prep.append(f"check {name}: {len(mod.ITEMS)} items, timeout {mod.TIMEOUT_S} s, planned")
        except Exception as e:  # noqa: BLE001 -- a dry run reports every broken check, then exits 1
            failed = True
            items = [report.item(f"{name}.plan", "failed", f"{type(e).__name__}: {e}")]
            mod = None
        checks.append({"check": name, "wall_s": round(time.perf_counter() - c0, 1),
                       "timeout_s": getattr(mod, "TIMEOUT_S", None), "items": items})
    rep = report.build_report("dry-run", started, time.perf_counter() - t0, env.versions(with_cuda=False),
                              {"name": "not queried (dry run)"}, checks, prep, env.code_version(ROOT))
    _write(out, rep)
    for p in prep:
        print(f"gpu-check: {p}")
    print(f"gpu-check: dry run {'FAILED' if failed else 'ok'}: {sum(len(c['items']) for c in checks)} items "
          f"of {len(checks)} checks planned; report in {out}/gpu-report.md")
    return 1 if failed else 0


def _write(out: Path, rep: dict) -> None:
    _atomic_write(out / "gpu-report.json", json.dumps(rep, indent=1, sort_keys=True) + "\n")
    _atomic_write(out / "gpu-report.md", report.render_markdown(rep))


def _tail(path: Path, n: int = 6) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(lines[-n:])


def check_timeout(own_s: float, left_s: float, after: int) -> float:
    """A check's timeout: its own ``TIMEOUT_S``, but leaving ``MIN_CHECK_S`` of the budget to each of the
    ``after`` checks still to come (pure)."""
    return max(0.0, min(float(own_s), left_s - after * MIN_CHECK_S))


#: seconds a check's process may take to exit once its result is written (NCCL or CUDA teardown can hang)
EXIT_GRACE_S = 15.0


def wait_check(proc, result: Path, deadline: float, poll_s: float = 0.5) -> tuple[int | None, str]:
    """Wait for a check's process: ``(returncode, "")`` when it exits by itself; killed, ``(None,
    "timeout")`` at ``deadline`` (``time.perf_counter()``) or ``(None, "exit")`` when ``result`` exists and
    it has not exited :data:`EXIT_GRACE_S` later."""
    seen = None
    while True:
        try:
            return proc.wait(timeout=poll_s), ""
        except subprocess.TimeoutExpired:
            now = time.perf_counter()
            if seen is None and result.exists():
                seen = now
            why = "timeout" if now >= deadline else "exit" if seen is not None and now - seen > EXIT_GRACE_S else ""
            if why:
                proc.kill()
                proc.wait()
                return None, why


def run_check(name: str, out: Path, timeout_s: float) -> dict:
    """Run check ``name`` in a child process under ``timeout_s``; its items (failed ones for a crash or a
    timeout, with the log's last lines)."""
    mod = check_module(name)
    logs, result = out / "logs", out / "work" / f"{name}.result.json"
    logs.mkdir(parents=True, exist_ok=True)
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    log = logs / f"{name}.log"
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "phoenix_hpc.gpucheck.run", "--one", name, str(out / "work"), str(result)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1",
                                     "PHOENIX_GPU_CHECK_DEADLINE": f"{time.time() + timeout_s:.3f}"})
        rc, hung = wait_check(proc, result, t0 + timeout_s)
    if hung == "timeout":
        why = f"timed out after {timeout_s:.0f} s: {_tail(log)}"
    elif hung == "exit":
        why = f"the check's process did not exit within {EXIT_GRACE_S:.0f} s of writing its result"
    else:
        why = "" if rc == 0 else f"the check's process exited {rc}: {_tail(log)}"
    wall = round(time.perf_counter() - t0, 1)
    items = []
    try:  # a result written before the process hung at exit (or crashed after it) is kept
        items = json.loads(result.read_text())
        if why:
            note = (f"kept: the check's process hung after writing its result and was killed ({why[:200]})"
                    if hung else f"kept: the check's process ended badly after writing its result ({why[:200]})")
            items = [{**it, "reason": "; ".join(x for x in (it.get("reason", ""), note) if x)} for it in items]
            why = ""
    except (OSError, ValueError) as e:
        why = why or f"no result from the check ({e}): {_tail(log)}"
    got = {it["name"] for it in items}
    items += report.failed_items([n for n in mod.ITEMS if n not in got], why or "the check did not report this item")
    return {"check": name, "wall_s": wall, "timeout_s": round(timeout_s), "items": items}


def gpu_run(out: Path, names: list[str], budget_s: float) -> int:
    """Run ``names`` on CUDA device 0 (the caller checked that CUDA is available) and write the report."""
    from phoenix_hpc.gpucheck import common, env

    t0, started = time.perf_counter(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    prep = [os.environ["PHOENIX_GPU_WHEELS_NOTE"]] if os.environ.get("PHOENIX_GPU_WHEELS_NOTE") else []
    lines, imported = _import_wheels()  # a failed import is listed; the checks that need it fail with it
    prep += lines
    code = env.code_version(ROOT)
    try:
        common.dataset(out / "work")
    except Exception as e:  # noqa: BLE001 -- reported; the checks that need the dataset fail with it
        prep.append(f"dataset not built: {type(e).__name__}: {str(e)[:200]}")
    versions, device = env.versions(with_cuda=True), env.device_facts()
    print(f"gpu-check: {device['name']}, torch {versions['torch']}, CUDA {versions['cuda']}, driver "
          f"{versions['driver']}, megatron-core {versions['megatron_core']}", flush=True)
    checks = []
    for i, name in enumerate(names):
        mod = check_module(name)
        timeout = check_timeout(mod.TIMEOUT_S, budget_s - (time.perf_counter() - t0), len(names) - i - 1)
        if timeout < MIN_CHECK_S:
            checks.append({"check": name, "wall_s": 0, "timeout_s": 0, "items": report.failed_items(
                list(mod.ITEMS), f"not run: the {budget_s:.0f} s budget was spent by the checks before it")})
        else:
            checks.append(run_check(name, out, timeout))
        for it in checks[-1]["items"]:
            print(f"gpu-check: {it['name']:28s} {it['status']:8s} {it['reason'][:160]}", flush=True)
    if not imported:
        checks.append({"check": "preparation", "wall_s": 0, "timeout_s": 0, "items": report.failed_items(
            ["gpu.imports"], "; ".join(p for p in lines if p.startswith("import failed")))})
    rep = report.build_report("gpu", started, time.perf_counter() - t0, versions, device, checks, prep, code)
    _write(out, rep)
    s = rep["summary"]
    print(f"gpu-check: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped in {rep['wall_s']} s; "
          f"report in {out}/gpu-report.md")
    return report.exit_code(rep)


def one(name: str, work: Path, result: Path) -> int:
    """Child process: run check ``name`` and write its items to ``result``."""
    mod = check_module(name)
    try:
        items = mod.run(work)
    except Exception as e:  # noqa: BLE001 -- every item failed with the error; the traceback goes to the log
        import traceback

        traceback.print_exc()
        items = report.failed_items(list(mod.ITEMS), f"{type(e).__name__}: {e}")
    _atomic_write(result, json.dumps(items))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--one"] and len(argv) == 4:
        rc = one(argv[1], Path(argv[2]), Path(argv[3]))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)  # the result is written: no interpreter teardown (NCCL, CUDA) that could hang after it
    ap = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description="Run the one-GPU checks.")
    ap.add_argument("--dry-run", action="store_true", help="everything up to the first CUDA call")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget of all checks")
    ap.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated checks (of {', '.join(CHECKS)})")
    ap.add_argument("out_dir", nargs="?", default="gpu-report",
                    help="folder for gpu-report.json, gpu-report.md, logs/ and work/ (default: gpu-report)")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    bad = [n for n in names if n not in CHECKS]
    if bad or not names:
        print(f"gpu-check: --only {a.only!r}: unknown check(s) {bad or '(none given)'}; allowed: {', '.join(CHECKS)}",
              file=sys.stderr)
        return 2
    if a.budget_s <= 0:
        print(f"gpu-check: --budget-s {a.budget_s}: must be > 0 seconds", file=sys.stderr)
        return 2
    out = Path(a.out_dir)
    if out.exists() and not out.is_dir():
        print(f"gpu-check: OUT_DIR {out} exists and is not a folder", file=sys.stderr)
        return 2
    if a.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        return dry_run(out, names)
    import torch

    if not torch.cuda.is_available():  # before anything is written
        print("gpu-check: no CUDA device is visible (torch.cuda.is_available() is False; torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda}); run on a machine with a CUDA GPU, or "
              "use --dry-run here", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    return gpu_run(out, names, a.budget_s)


if __name__ == "__main__":
    sys.exit(main())
