"""Which commit each section of BENCHMARKS.md measured, and whether the code it measures changed since.

Every section's numbers were measured on the code of one commit: the run's (``commit`` of
``BENCHMARKS.json``), the section's own where it was measured by a command of its own (``control_plane``,
``recovery_by_size``) or kept from an earlier run (``kept_from``), and for a GPU report the one it names or,
for reports that name none, the commit that added its file. :func:`check` asks git, at the time the page is
written, which commits since then changed the files the section depends on (:data:`SECTION_CODE`), so that a
reader sees when a number describes code that is no longer the project's.

:func:`section_commit`, :func:`lines` are pure; :func:`check` runs ``git`` (``rev-parse``, ``rev-list``,
``diff --name-only``, ``log``) in the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_RUNTIME = ("phoenix_hpc/runtime", "phoenix_hpc/engines", "phoenix_hpc/launch", "phoenix_hpc/topology.py")
_RECOVERY = _RUNTIME + ("phoenix_hpc/control", "phoenix_hpc/recovery", "phoenix_hpc/slurm",
                        "phoenix_hpc/bench/recovery.py", "phoenix_hpc/bench/baselines.py", "phoenix_hpc/bench/jobs.py")

#: The code each kept section of ``BENCHMARKS.json`` measures (paths relative to the repository; a folder
#: stands for every file under it): what a change to would change its numbers. The report's own rendering is
#: left out (a change of wording changes no number).
SECTION_CODE: dict[str, tuple[str, ...]] = {
    "overhead": _RUNTIME + ("phoenix_hpc/bench/overhead.py", "phoenix_hpc/bench/overhead_rank.py",
                            "phoenix_hpc/bench/throughput.py", "phoenix_hpc/bench/cpu_demand.py",
                            "phoenix_hpc/bench/stats.py", "phoenix_hpc/bench/jobs.py", "phoenix_hpc/slurm/render.py",
                            "phoenix_hpc/profiles"),
    "agreement_overhead": _RUNTIME + ("phoenix_hpc/bench/agreement_overhead.py", "phoenix_hpc/bench/overhead_rank.py",
                                      "phoenix_hpc/bench/stats.py", "phoenix_hpc/bench/jobs.py"),
    "recovery": _RECOVERY + ("phoenix_hpc/bench/stats.py",),
    "scaling": _RECOVERY,
    "recovery_by_size": _RECOVERY + ("phoenix_hpc/bench/by_size.py", "phoenix_hpc/bench/stats.py"),
    "control_plane": ("phoenix_hpc/control", "phoenix_hpc/recovery/plan.py", "phoenix_hpc/recovery/plan_records.py",
                      "phoenix_hpc/topology.py", "phoenix_hpc/bench/control_plane.py", "phoenix_hpc/bench/ctlsim.py",
                      "phoenix_hpc/bench/control_plane_report.py", "phoenix_hpc/model/fit.py"),
    "gpu_reports": ("phoenix_hpc/gpucheck", "phoenix_hpc/runtime", "phoenix_hpc/engines", "phoenix_hpc/launch",
                    "scripts/gpu-check.sh"),
}
#: How many changed files a warning names before it counts the rest.
NAMED_FILES = 8

_KEPT = re.compile(r"commit\s+([0-9a-f]{4,40})")


def _bare(commit) -> str | None:
    """A recorded commit without its ``+dirty`` mark; None for missing or "unknown"."""
    c = str(commit or "").split("+", 1)[0].strip()
    return c if re.fullmatch(r"[0-9a-f]{4,40}", c) else None


def section_commit(results: dict, key: str) -> tuple[str | None, bool]:
    """The commit section ``key`` of ``results`` (a BENCHMARKS.json) measured and whether files differed from
    it during that run (pure): the section's own ``commit``, else the one its ``kept_from`` names, else the
    run's ``commit``; ``(None, False)`` when none is recorded."""
    sec = results.get(key) if isinstance(results.get(key), dict) else {}
    if sec.get("commit"):
        raw = str(sec["commit"])
        return _bare(raw), raw.endswith("+dirty") or bool(sec.get("dirty_files"))
    m = _KEPT.search(str(sec.get("kept_from") or ""))
    if m:
        return m.group(1), False
    raw = str(results.get("commit") or "")
    return _bare(raw), raw.endswith("+dirty") or bool(results.get("dirty_files"))


def _git(repo: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def changes_since(repo: Path, commit: str | None, paths: tuple[str, ...]) -> dict:
    """What git says changed in ``paths`` from ``commit`` to HEAD: ``{"commit", "commits_since",
    "changed_files", "changed_lines"}`` (the files most changed first; lines added plus deleted), or
    ``{"commit", "unknown": why}`` when the commit is not recorded or not in the
    repository's history."""
    if not commit:
        return {"commit": None, "unknown": "the measured commit was not recorded"}
    full = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if not full:
        return {"commit": commit, "unknown": f"commit {commit} is not in this repository's history"}
    count = _git(repo, "rev-list", "--count", f"{full}..HEAD", "--", *paths)
    numstat = _git(repo, "diff", "--numstat", full, "HEAD", "--", *paths)
    if count is None or numstat is None:
        return {"commit": commit, "unknown": "git could not compare it with HEAD"}
    churn = []  # (lines added + deleted, path); binary files count 0
    for row in numstat.splitlines():
        add, rm, path = row.split("\t", 2)
        churn.append((int(add) + int(rm) if add.isdigit() and rm.isdigit() else 0, path))
    churn.sort(key=lambda x: (-x[0], x[1]))
    return {"commit": commit, "commits_since": int(count), "changed_files": [p for _, p in churn],
            "changed_lines": sum(n for n, _ in churn)}


def added_by(repo: Path, path: str) -> str | None:
    """The commit that added ``path`` (relative to the repository), 12 hex digits; None if git has none."""
    out = _git(repo, "log", "--diff-filter=A", "--format=%h", "--abbrev=12", "-1", "--", path)
    return out or None


def check(results: dict, repo: Path) -> dict:
    """The provenance of every section ``results`` (a BENCHMARKS.json) holds, checked against the repository's
    HEAD now: ``{"checked_at": HEAD, "sections": {key: changes_since(...) + {"dirty": bool}}, "gpu_reports":
    {file: ...}}``. GPU reports without a ``commit`` are dated by the commit that added their file under
    ``benchmarks/gpu/`` (``"commit_from": "added"``)."""
    repo = Path(repo)
    out: dict = {"checked_at": _git(repo, "rev-parse", "--short=12", "HEAD") or "unknown", "sections": {},
                 "gpu_reports": {}}
    for key, paths in SECTION_CODE.items():
        if key == "gpu_reports" or not isinstance(results.get(key), dict):
            continue
        commit, dirty = section_commit(results, key)
        out["sections"][key] = {**changes_since(repo, commit, paths), "dirty": dirty}
    for rep in results.get("gpu_reports") or []:
        name = rep.get("file")
        if not name:
            continue
        commit, how = _bare((rep.get("code") or {}).get("commit") or rep.get("commit")), "recorded"
        if commit is None:
            commit, how = added_by(repo, f"benchmarks/gpu/{name}"), "added"
        out["gpu_reports"][name] = {**changes_since(repo, commit, SECTION_CODE["gpu_reports"]), "commit_from": how}
    return out


def lines(entry: dict | None, checked_at: str | None, what: str = "This section") -> list[str]:
    """The sentence under a section's heading (pure): the commit it measured, and a warning when the code it
    measures changed between that commit and ``checked_at`` (the HEAD when the page was written), naming the
    changed files (the first :data:`NAMED_FILES`). Empty when ``entry`` is None (no check was made)."""
    if not entry:
        return []
    c = entry.get("commit")
    if "unknown" in entry:
        return [f"{what}: the code it measured cannot be dated ({entry['unknown']}); compare its numbers with care.",
                ""]
    dirty = " (with uncommitted changes)" if entry.get("dirty") else ""
    added = " (not recorded by the report: the commit that added its file)" if entry.get("commit_from") == "added" else ""
    files = entry.get("changed_files") or []
    if not files:
        return [f"{what} measured commit `{c}`{added}{dirty}; the code it measures was unchanged at `{checked_at}`, "
                "when this page was written.", ""]
    named = ", ".join(f"`{f}`" for f in files[:NAMED_FILES]) + (
        f" and {len(files) - NAMED_FILES} more" if len(files) > NAMED_FILES else "")
    subject = what[0].lower() + what[1:] if what.startswith("This ") else what
    return [f"**Warning: the code {subject} measured has changed since.** It measured commit `{c}`{added}{dirty}; by `{checked_at}`, when this "
            f"page was written, {entry.get('commits_since')} commit(s) had changed {len(files)} of the files it "
            f"depends on ({entry.get('changed_lines', '?')} lines added or deleted; most changed first): {named}. "
            f"Its numbers describe the code of `{c}`.", ""]


def gpu_lines(prov: dict | None, reports: list[dict]) -> list[str]:
    """One line per kept GPU run (numbered as the GPU section numbers them, newest first) with the commit it
    measured and whether the code it measures changed since (pure); empty without a check."""
    if not prov or not reports:
        return []
    out = ["The code each GPU run measured:", ""]
    for i, rep in enumerate(reports, 1):
        entry = (prov.get("gpu_reports") or {}).get(rep.get("file"))
        for line in lines(entry, prov.get("checked_at"), f"Run {i} (`{rep.get('file')}`)")[:1]:
            out.append(f"- {line}")
    return out + [""]


def header_lines(prov: dict | None) -> list[str]:
    """The page's note on when its sections' code was checked (pure)."""
    if not prov:
        return []
    stale = [k for k, e in (prov.get("sections") or {}).items() if e.get("changed_files") or "unknown" in e]
    stale += [f for f, e in (prov.get("gpu_reports") or {}).items() if e.get("changed_files") or "unknown" in e]
    what = (f"{len(stale)} of them measured code that has changed since, or cannot be dated: each says so under "
            "its heading" if stale else "none of them measured code that has changed since")
    return [f"Each section names the commit it measured, checked against `{prov.get('checked_at')}` when this page "
            f"was written (git; the files each depends on are listed in `phoenix_hpc/bench/provenance.py`): {what}. "
            "`python -m phoenix_hpc.bench.report refresh` checks again and re-renders the page.  "]
