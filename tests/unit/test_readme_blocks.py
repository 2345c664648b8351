"""Every ``bash`` block of README.md is run as written by a test, or is listed here with why the local cluster
cannot run it and what checks it instead.

tests/e2e/test_readme_tour.py runs the blocks of the sections it names (``TOUR``, ``AFTER_TOUR``) command by
command. A block added to any other section, or a changed command of a block listed in :data:`NOT_HERE`, fails
here until it is given a test or a reason.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOUR_TEST = ROOT / "tests" / "e2e" / "test_readme_tour.py"

#: sections whose blocks tests/e2e/test_readme_tour.py runs as written (its constants TOUR and AFTER_TOUR)
RUN_BY_TOUR_TEST = ("A 5-minute tour", "Planned drains", "When spares run out: shrink")

#: section -> (its blocks' commands, exactly; why no test runs them as written; what runs or checks them)
NOT_HERE = {
    "Set-up: two commands": (
        ["scripts/demo.sh", "scripts/test.sh"],
        "demo.sh installs the system packages and runs two 50-step jobs of its own cluster; test.sh is the suite "
        "itself",
        "tests/e2e/test_demo.py runs scripts/demo.sh with fewer steps on its own cluster (and its Ctrl-C); "
        "test.sh runs every test",
    ),
    "Running on Perlmutter and Vista": (
        ["phoenix submit --site perlmutter examples/perlmutter-7b.yaml --dry-run",
         "phoenix submit --site perlmutter examples/perlmutter-7b.yaml",
         "phoenix status"],
        "Perlmutter only: the dataset on $SCRATCH (a dry run here refuses its data.path, exit 2), the site's "
        "Slurm, account and modules, CUDA GPUs",
        "tests/unit/test_submit_cli.py: the dry run with --data-on-cluster, and without it the data.path "
        "refusal; tests/golden: the rendered Perlmutter and Vista scripts",
    ),
}


def bash_blocks(readme: str) -> list[tuple[str, list[str]]]:
    """Each ``bash`` block of ``readme`` (also one indented in a list) as (its ``## `` section, its commands
    without comments), in order."""
    out = []
    section = None
    lines = readme.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip() == "```bash":
            j = lines.index(line.replace("```bash", "```"), i + 1)
            body = textwrap.dedent("\n".join(lines[i + 1:j]))
            cmds = [re.split(r"\s+#\s+", x.strip(), maxsplit=1)[0] for x in body.splitlines()]
            out.append((section, [c for c in cmds if c]))
            i = j
        i += 1
    return out


def test_every_readme_bash_block_is_run_by_a_test_or_says_why_not():
    blocks = bash_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 13, blocks  # the parser found the blocks (13 when this test was written)
    tour_test = TOUR_TEST.read_text()
    for section in RUN_BY_TOUR_TEST:  # the tour test reads these sections by title
        assert f'"{section}"' in tour_test, section
    listed = {}
    for section, cmds in blocks:
        if section in RUN_BY_TOUR_TEST:
            continue
        assert section in NOT_HERE, (f"README section {section!r} has a bash block no test runs: {cmds}; run it "
                                     f"in tests/e2e/test_readme_tour.py or say in NOT_HERE why it cannot run here")
        listed.setdefault(section, []).extend(cmds)
    assert listed == {s: cmds for s, (cmds, _, _) in NOT_HERE.items()}, (
        "the commands of a README block that no test runs changed: check whether they can run here now, and "
        f"update NOT_HERE; README: {listed}")


def test_bash_blocks_reads_sections_commands_and_indented_blocks():
    text = ("## A\n\n```bash\nx --y    # a comment\n\nz\n```\n\n## B\n\n1. step:\n\n   ```bash\n   w   # c\n"
            "   ```\n\n```text\nnot bash\n```\n")
    assert bash_blocks(text) == [("A", ["x --y", "z"]), ("B", ["w"])]
