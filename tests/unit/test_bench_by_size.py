"""Section 3's "what grows with the model" (phoenix_hpc/bench/by_size.py: section ``by_size`` of
scripts/bench.sh, and scripts/measure-recovery-by-size.py): rendered from BENCHMARKS.json, kept across runs of
other sections."""

import json

from phoenix_hpc.bench.report import by_size_lines, write_all

ROWS = {"S": {"params": 827392, "total_s": 1.2, "phase.replay": 0.1, "engine": 0.05},
        "L": {"params": 10764288, "total_s": 4.8, "phase.replay": 2.6, "engine": 0.4}}


def test_by_size_lines_give_each_part_and_the_ratio():
    lines = by_size_lines({"rows": ROWS, "date": "d", "commit": "c" * 40, "command": "cmd", "findings": ["- f"]})
    assert "| part (s) | S (0.83 M) | L (10.76 M) | ratio |" in lines
    assert "commit `cccccccccccc`" in lines[0]
    assert "commit `abcdefabcdef+dirty`" in by_size_lines({"rows": ROWS, "commit": "abcdefabcdef0123+dirty"})[0]
    assert "| engine | 0.050 | 0.400 | 8.00 |" in lines and "- f" in lines
    # BENCHMARKS.json keeps its keys sorted (L before S): the smaller model still comes first
    assert by_size_lines({"rows": dict(sorted(ROWS.items()))}) == by_size_lines({"rows": ROWS})
    assert by_size_lines(None) == [] and by_size_lines({"rows": {}}) == []


def test_a_full_run_keeps_the_by_size_section(tmp_path):
    (tmp_path / "BENCHMARKS.json").write_text(json.dumps({"recovery_by_size": {"rows": ROWS}}))
    write_all({"mode": "full"}, tmp_path)
    assert json.loads((tmp_path / "BENCHMARKS.json").read_text())["recovery_by_size"]["rows"] == ROWS


def test_trials_are_reduced_to_medians_and_the_core_ratio_has_an_interval():
    from phoenix_hpc.bench import by_size as mod

    runs = {"S": [{"params": 8, "total_s": t, "phase.replay": 0.1, "phase.reconfigure": 0.3, "phase.detect": 0.05,
                   "kill.slot_exit": 0.04, "slot_rss_mib": 400.0, "slot_huge_mib": 10.0} for t in (1.1, 1.3, 1.2)],
            "L": [{"params": 99, "total_s": t, "phase.replay": 1.0, "phase.reconfigure": 0.3, "engine": 0.1,
                   "phase.detect": 0.3, "kill.slot_exit": None if t == 2.5 else 0.29,
                   "slot_rss_mib": None if t == 2.5 else t * 300, "slot_huge_mib": 500.0} for t in (2.9, 2.5, 2.7)]}
    rows = mod.median_rows(runs)
    assert rows["S"]["total_s"] == 1.2 and rows["L"]["engine"] == 0.1 and rows["L"]["trials"] == 3
    assert rows["S"]["core_s"] == [1.0, 1.2, 1.1] and rows["L"]["recovery_s"] == [1.6, 1.2, 1.4]
    assert rows["L"]["kill.slot_exit"] == 0.29  # a trial that could not watch the exit is left out
    f = mod.findings(rows)
    assert "S 1.10 s (trials 1.00, 1.20, 1.10), L 1.70 s" in f[0] and "1.55x [95 % CI" in f[0]
    assert "without the detection" in f[1] and "S 1.05 s" in f[1] and "L 1.40 s" in f[1]
    assert "0.04 -> 0.29 s" in f[2]
    # the killed slot's memory: medians over the trials that could read it, named in the detection's line and
    # kept out of the seconds table
    assert rows["L"]["slot_rss_mib"] == 840.0 and rows["S"]["slot_huge_mib"] == 10.0
    assert "resident 400 -> 840 MiB, of it in transparent huge pages 10 -> 500 MiB" in f[2]
    lines = by_size_lines({"rows": rows, "date": "d", "commit": "c", "command": "cmd", "findings": f})
    assert any("3 and 3 jobs per model, run interleaved, the same fault; per part the median over the jobs of the "
               "largest time any member reports" in x for x in lines)
    assert "| engine | - | 0.100 | - |" in lines and not any(
        x.startswith(("| core_s", "| recovery_s", "| slot_rss_mib", "| slot_huge_mib")) for x in lines)


def test_resident_mib_reads_rss_and_huge_pages(tmp_path):
    import os

    from phoenix_hpc.slurm.procs import resident_mib

    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "smaps_rollup").write_text(
        "55a0-7ffc ---p 00000000 00:00 0  [rollup]\nRss:              819200 kB\nPss:  1 kB\n"
        "AnonHugePages:    598016 kB\n")
    assert resident_mib(7, proc_root=str(tmp_path)) == (800.0, 584.0)
    assert resident_mib(8, proc_root=str(tmp_path)) == (None, None)  # gone
    rss, huge = resident_mib(os.getpid())  # this process, from the real /proc
    assert rss > 10 and 0 <= huge <= rss


def test_thp_mode_is_the_bracketed_word_or_none(tmp_path):
    from phoenix_hpc.slurm.procs import thp_mode

    for text, want in (("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
                       ("always madvise [never]\n", "never"), ("no brackets\n", None)):
        (tmp_path / "enabled").write_text(text)
        assert thp_mode(str(tmp_path / "enabled")) == want
    assert thp_mode(str(tmp_path / "missing")) is None


def test_a_run_of_other_sections_keeps_the_by_size_one_and_a_missing_one_says_why(tmp_path):
    from phoenix_hpc.bench.run import SECTIONS, keep_previous_sections

    assert "by_size" in SECTIONS
    prev = tmp_path / "BENCHMARKS.json"
    prev.write_text(json.dumps({"date": "D", "commit": "C", "recovery_by_size": {"rows": ROWS}}))
    res = keep_previous_sections({"overhead": {"cases": []}}, prev, ["overhead"])
    assert res["recovery_by_size"]["rows"] == ROWS and "by_size" in res["kept_sections"]
    res = keep_previous_sections({"recovery_by_size": {"rows": {}}}, prev, ["by_size"])
    assert res["recovery_by_size"] == {"rows": {}}
    assert by_size_lines({"unavailable": "not run in --quick mode (each trial is a job of its own)"})[0] == (
        "What grows with the model, per recovery part: **not measured (not run in --quick mode (each trial is a "
        "job of its own))**.")
    assert "failed: BenchError: no recovery" in by_size_lines({"name": "by_size", "error": "BenchError: no\nrecovery"})[0]


def test_the_section_is_rendered_even_when_the_scaling_section_is_missing(tmp_path):
    write_all({"mode": "full", "recovery_by_size": {"rows": ROWS, "commit": "c" * 40, "command": "cmd"}}, tmp_path)
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| engine | 0.050 | 0.400 | 8.00 |" in text

