"""``resilience.checkpoint.restart: in-job`` and ``resilience.recovery_source: checkpoint``: the config
fields (refused outside their mode, naming the allowed values) and the batch script's in-job loop (bash -n;
a new srun step on the nodes left, the step ended at once on a restart request)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.config import load_job_config
from phoenix_hpc.config.resolve import resolve
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.profiles import load_profile
from phoenix_hpc.slurm.render import render_sbatch

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, **resilience) -> Path:
    cfg = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    cfg["data"]["path"] = str(ROOT / "data" / "stdlib")
    cfg["resilience"].update(resilience)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.parametrize("res,needle", [
    ({"mode": "checkpoint-restart", "checkpoint": {"restart": "inside"}}, "'requeue' or 'in-job'"),
    ({"mode": "phoenix", "checkpoint": {"restart": "in-job"}}, "needs mode 'checkpoint-restart'"),
    ({"mode": "phoenix", "recovery_source": "disk"}, "'memory' or 'checkpoint'"),
    ({"mode": "checkpoint-restart", "recovery_source": "checkpoint"}, "needs mode 'phoenix'"),
])
def test_restart_fields_are_refused_naming_the_allowed_values(tmp_path, res, needle):
    with pytest.raises(ConfigError) as e:
        load_job_config(_cfg(tmp_path, **res))
    assert needle in str(e.value)


def test_phoenix_submit_exits_2_on_an_unknown_restart(tmp_path):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    p = _cfg(tmp_path, mode="checkpoint-restart", checkpoint={"restart": "inside"})
    res = CliRunner().invoke(cli, ["submit", "--site", "local", "--dry-run", str(p)])
    assert res.exit_code == 2, res.output
    assert "restart" in res.output and "'requeue' or 'in-job'" in res.output and "Traceback" not in res.output


def _script(tmp_path, restart: str) -> str:
    cfg = load_job_config(_cfg(tmp_path, mode="checkpoint-restart", checkpoint={"restart": restart}))
    prof = load_profile("local")
    return render_sbatch(resolve(cfg, prof, run_dir="/scratch/runs/x", default_python="/opt/py"), prof)


def test_in_job_script_loops_over_srun_steps_in_the_allocation(tmp_path):
    s = _script(tmp_path, "in-job")
    subprocess.run(["bash", "-n"], input=s, text=True, check=True)
    loop = s[s.index("while :; do\n  # 1. the coordinator"):]
    assert '--nodes="$STEP_NODES"' in loop and '--ntasks="$((STEP_NODES * 1))"' in loop and '${STEP_NODELIST:+--nodelist="$STEP_NODELIST"}' in loop
    assert 'scancel --signal=KILL "${SLURM_JOB_ID}.${STEP_NO}"' in loop
    assert "-m phoenix_hpc.control.in_job next-nodes" in loop and "STEP_NO=$((STEP_NO + 1))" in loop
    assert loop.index("srun ") < loop.index("next-nodes") < loop.index("\ndone\n")
    assert [x.strip()[:5] for x in s.splitlines()].count("srun ") == 1  # one srun line, run once per step


def test_requeue_script_has_no_loop(tmp_path):
    s = _script(tmp_path, "requeue")
    assert "STEP_NO" not in s and "in_job" not in s and 'scancel --signal=KILL "${SLURM_JOB_ID}.0"' in s
