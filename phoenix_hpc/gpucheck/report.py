"""The GPU check's report: result items, the summary, and the Markdown rendering (pure, no I/O).

One *item* is one verdict of a check, a JSON-serialisable dict::

    {"name": "megatron.restore", "status": "passed" | "failed" | "skipped",
     "reason": "why (always set for failed and skipped)", "numbers": {...}, "limit": "what one GPU limits"}

The report (``gpu-report.json``) is::

    {"format": 1, "mode": "gpu" | "dry-run", "started": ISO time, "wall_s", "versions": {...},
     "device": {...}, "checks": [{"check", "wall_s", "timeout_s", "items": [item, ...]}, ...],
     "summary": {"passed", "failed", "skipped"}, "preparation": [...],
     "code": {"commit", "source_digest"}}
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.bench.report import fmt_number

STATUSES = ("passed", "failed", "skipped")
FORMAT = 1


def item(name: str, status: str, reason: str = "", numbers: dict | None = None, limit: str = "") -> dict:
    """One verdict. ``status`` must be one of :data:`STATUSES`; failed and skipped need a ``reason``.

    Raises:
        ValueError: an unknown status, or a failed/skipped item without a reason.
    """
    if status not in STATUSES:
        raise ValueError(f"item {name}: status {status!r} is not one of {STATUSES}")
    if status != "passed" and not reason:
        raise ValueError(f"item {name}: a {status} item needs a reason")
    return {"name": name, "status": status, "reason": reason, "numbers": dict(numbers or {}), "limit": limit}


def equal_item(name: str, got: Any, want: Any, what: str, numbers: dict | None = None, limit: str = "") -> dict:
    """``passed`` when ``got == want``, else ``failed`` naming ``what`` and both values."""
    if got == want:
        return item(name, "passed", numbers=numbers, limit=limit)
    return item(name, "failed", f"{what}: got {got!r}, expected {want!r}", numbers=numbers, limit=limit)


def failed_items(names: list[str], reason: str, limit: str = "") -> list[dict]:
    """Every name as ``failed`` with the same reason (a check that ended before its verdicts)."""
    return [item(n, "failed", reason, limit=limit) for n in names]


def summarize(checks: list[dict]) -> dict[str, int]:
    """Count the items of every check by status."""
    counts = dict.fromkeys(STATUSES, 0)
    for c in checks:
        for it in c["items"]:
            counts[it["status"]] += 1
    return counts


def exit_code(report: dict) -> int:
    """0 when no item failed, 1 otherwise (skipped items do not fail the run, and are listed)."""
    return 1 if report["summary"]["failed"] else 0


def build_report(mode: str, started: str, wall_s: float, versions: dict, device: dict, checks: list[dict],
                 preparation: list[str] | None = None, code: dict | None = None) -> dict:
    """The report dict (see the module docstring). ``mode`` is ``gpu`` or ``dry-run``; ``code``: the commit
    and source digest measured (:func:`phoenix_hpc.gpucheck.env.code_version`).

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in ("gpu", "dry-run"):
        raise ValueError(f"mode {mode!r} is not 'gpu' or 'dry-run'")
    return {"format": FORMAT, "mode": mode, "started": started, "wall_s": round(wall_s, 1), "versions": versions,
            "device": device, "checks": checks, "summary": summarize(checks), "preparation": list(preparation or []),
            "code": dict(code or {"commit": "unknown: not recorded", "source_digest": "unknown"})}


def render_markdown(report: dict) -> str:
    """``gpu-report.md``: versions, device, one table row per item, then each item's numbers and limits."""
    v, d, s = report["versions"], report["device"], report["summary"]
    lines = [
        f"# GPU check ({report['mode']})", "",
        f"Started {report['started']}, {report['wall_s']} s wall. "
        f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped.", "",
        "| | |", "| --- | --- |",
    ]
    code = report.get("code") or {}
    lines.append(f"| commit | {code.get('commit', 'not recorded (a report from before commits were recorded)')} |")
    lines.append(f"| source digest | {code.get('source_digest', 'not recorded')} |")
    for k in ("torch", "cuda", "driver", "nccl", "megatron_core", "python"):
        lines.append(f"| {k} | {v.get(k, 'unknown')} |")
    for k in ("name", "memory_gib", "capability", "pcie"):
        if k in d:
            lines.append(f"| device {k} | {fmt_number(d[k])} |")
    if report.get("preparation"):
        lines += ["", "Preparation:", ""] + [f"- {p}" for p in report["preparation"]]
    lines += ["", "| check | item | status | reason |", "| --- | --- | --- | --- |"]
    for c in report["checks"]:
        for it in c["items"]:
            reason = it["reason"].replace("|", "/").replace("\n", " ")
            lines.append(f"| {c['check']} | {it['name']} | **{it['status']}** | {reason} |")
    for c in report["checks"]:
        lines += ["", f"## {c['check']}", "", f"{c.get('wall_s', 0)} s of a {c.get('timeout_s', '?')} s limit."]
        for it in c["items"]:
            if not it["numbers"] and not it["limit"]:
                continue
            lines += ["", f"{it['name']} ({it['status']}):"]
            lines += [f"- {k}: {fmt_number(val)}" for k, val in it["numbers"].items()]
            if it["limit"]:
                lines.append(f"- one GPU: {it['limit']}")
    return "\n".join(lines) + "\n"

