"""Every BENCHMARKS.md section names the commit it measured and warns when the code it measures changed since
(git in a scratch repository); section 5 is kept across full runs and the capacity table cites it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from phoenix_hpc.bench import control_plane_report as CPR
from phoenix_hpc.bench import provenance as P
from phoenix_hpc.bench import report

ROOT = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "phoenix_hpc" / "control").mkdir(parents=True)
    (r / "phoenix_hpc" / "runtime").mkdir(parents=True)
    _git(r.parent, "init", "-q", str(r))
    _git(r, "config", "user.email", "t@example.invalid")
    _git(r, "config", "user.name", "t")
    (r / "phoenix_hpc" / "control" / "coordinator.py").write_text("x = 1\n")
    (r / "phoenix_hpc" / "runtime" / "d2h.py").write_text("y = 1\n")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "first")
    return r


def test_a_section_warns_when_the_code_it_measures_changed_since(repo):
    first = _git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / "phoenix_hpc" / "runtime" / "d2h.py").write_text("y = 2\nz = 3\n")
    _git(repo, "commit", "-q", "-am", "runtime changed")
    results = {"commit": first, "overhead": {"cases": []}, "control_plane": {"commit": first + "+dirty"},
               "recovery": {"kept_from": f"D, commit {first}"}}
    prov = P.check(results, repo)
    ov, cp, rec = (prov["sections"][k] for k in ("overhead", "control_plane", "recovery"))
    assert ov["commit"] == first and ov["commits_since"] == 1 and ov["changed_files"] == ["phoenix_hpc/runtime/d2h.py"]
    assert ov["changed_lines"] == 3 and rec["changed_files"] == ["phoenix_hpc/runtime/d2h.py"]
    assert cp["changed_files"] == [] and cp["dirty"] is True  # the control plane's code did not change
    head = prov["checked_at"]
    (warn, _) = P.lines(ov, head)
    assert warn.startswith("**Warning: the code this section measured has changed since.**")
    assert f"`{first}`" in warn and f"`{head}`" in warn and "`phoenix_hpc/runtime/d2h.py`" in warn
    (ok, _) = P.lines(cp, head)
    assert "unchanged" in ok and "uncommitted" in ok and "Warning" not in ok
    # a commit that is not recorded, or not in the history, cannot be dated: said so
    prov = P.check({"overhead": {"cases": []}, "scaling": {"commit": "abcdef123456"}}, repo)
    assert "not recorded" in P.lines(prov["sections"]["overhead"], head)[0]
    assert "not in this repository's history" in P.lines(prov["sections"]["scaling"], head)[0]


def test_the_page_carries_each_sections_commit_and_warning(repo):
    first = _git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / "phoenix_hpc" / "control" / "coordinator.py").write_text("x = 2\n")
    _git(repo, "commit", "-q", "-am", "control changed")
    data = json.loads((ROOT / "BENCHMARKS.json").read_text())
    data["control_plane"] = {**json.loads((ROOT / report.CONTROL_PLANE_RECORD).read_text()), "commit": first}
    data["commit"] = first
    for k in ("overhead", "recovery", "scaling", "recovery_by_size"):
        data[k] = {**data[k], "commit": first} if k == "recovery_by_size" else {**data[k], "kept_from": None}
    md = report.render_markdown(report.with_provenance(data, repo))
    sec5 = md[md.index(CPR.SECTION_TITLE):]
    assert sec5.split("\n")[2].startswith("**Warning: the code this section measured has changed since.**")
    assert "`phoenix_hpc/control/coordinator.py`" in sec5.split("\n")[2]
    sec1 = md[md.index("## 1. "):md.index("## 2. ")]
    assert f"measured commit `{first}`" in sec1 and "unchanged" in sec1  # the runtime did not change
    assert "Each section names the commit it measured" in md


def test_section_5_survives_a_full_run_written_to_a_fresh_folder(tmp_path):
    """A full run writes its report from its own sections; section 5, measured by a command of its own, comes
    from the kept record in the repository, not from whatever BENCHMARKS.json the output folder holds."""
    results = {"mode": "full", "commit": "c" * 12, "overhead": {"error": "not run here"}}
    report.with_kept_records(results, ROOT)
    report.write_all(results, tmp_path / "fresh")
    md = (tmp_path / "fresh" / "BENCHMARKS.md").read_text()
    assert CPR.SECTION_TITLE in md
    kept = json.loads((ROOT / report.CONTROL_PLANE_RECORD).read_text())
    assert json.loads((tmp_path / "fresh" / "BENCHMARKS.json").read_text())["control_plane"]["date"] == kept["date"]


def test_the_capacity_table_cites_the_kept_run_and_a_section_the_page_has():
    from phoenix_hpc.control.capacity_table import MEASURED

    kept = json.loads((ROOT / report.CONTROL_PLANE_RECORD).read_text())
    assert kept["date"] in MEASURED["source"] and str(kept["commit"]) in MEASURED["source"]
    assert report.CONTROL_PLANE_RECORD in MEASURED["source"]
    assert f'"{CPR.SECTION_TITLE[3:]}"' in MEASURED["source"]
    assert CPR.SECTION_TITLE in (ROOT / "BENCHMARKS.md").read_text()
    assert json.loads((ROOT / "BENCHMARKS.json").read_text())["control_plane"] == kept


def test_update_benchmarks_keeps_the_record_and_rerenders_the_page(tmp_path):
    kept = json.loads((ROOT / report.CONTROL_PLANE_RECORD).read_text())
    (tmp_path / "BENCHMARKS.json").write_text(json.dumps({"mode": "full", "commit": "x", "overhead_ratio": 1.1}))
    CPR.update_benchmarks(tmp_path, kept, table=tmp_path / "table.py")
    assert json.loads((tmp_path / report.CONTROL_PLANE_RECORD).read_text()) == kept
    data = json.loads((tmp_path / "BENCHMARKS.json").read_text())
    assert data["control_plane"] == kept and data["overhead_ratio"] == 1.1 and "provenance" in data
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert md.count(CPR.SECTION_TITLE) == 1 and f"measured commit `{kept['commit'].split('+')[0]}`" in md
    assert "MEASURED = " in (tmp_path / "table.py").read_text()


def test_refresh_names_the_file_that_is_not_json(tmp_path, capsys):
    (tmp_path / "BENCHMARKS.json").write_text("{not json")
    assert report.main(["refresh", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"refresh: {tmp_path / 'BENCHMARKS.json'}: not JSON" in err and "control_plane.json" not in err
    assert (tmp_path / "BENCHMARKS.json").read_text() == "{not json" and not (tmp_path / "BENCHMARKS.md").exists()
