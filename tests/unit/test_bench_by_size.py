"""Section 3's "what grows with the model" (scripts/measure-recovery-by-size.py): rendered from
BENCHMARKS.json and kept across full benchmark runs, as the control-plane section is."""

import json

from phoenix_hpc.bench.report import by_size_lines, write_all

ROWS = {"S": {"params": 827392, "total_s": 1.2, "phase.replay": 0.1, "engine": 0.05},
        "L": {"params": 10764288, "total_s": 4.8, "phase.replay": 2.6, "engine": 0.4}}


def test_by_size_lines_give_each_part_and_the_ratio():
    lines = by_size_lines({"rows": ROWS, "date": "d", "commit": "c" * 40, "command": "cmd", "findings": ["- f"]})
    assert "| part (s) | S (0.83 M) | L (10.76 M) | ratio |" in lines
    assert "| engine | 0.050 | 0.400 | 8.00 |" in lines and "- f" in lines
    assert by_size_lines(None) == [] and by_size_lines({"rows": {}}) == []


def test_a_full_run_keeps_the_by_size_section(tmp_path):
    (tmp_path / "BENCHMARKS.json").write_text(json.dumps({"recovery_by_size": {"rows": ROWS}}))
    write_all({"mode": "full"}, tmp_path)
    assert json.loads((tmp_path / "BENCHMARKS.json").read_text())["recovery_by_size"]["rows"] == ROWS
