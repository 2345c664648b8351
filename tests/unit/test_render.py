"""sbatch rendering: golden scripts for the three sites (compared line by line), Slurm options that matter
for PHOENIX, and hostile values that must stay inert (bash -n, then the script really run by bash with
recording stand-ins for srun/module/python)."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from phoenix_hpc.config import load_job_config
from phoenix_hpc.config.resolve import resolve
from phoenix_hpc.errors import SubmitError
from phoenix_hpc.profiles import load_profile
from phoenix_hpc.profiles.model import SiteProfile
from phoenix_hpc.slurm.render import render_sbatch, sbatch_cli_args, slurm_job_name

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
PYTHON = "/opt/phoenix/venv/bin/python"
CASES = {"perlmutter": "perlmutter-7b", "vista": "vista-7b", "local": "gpt-small"}


def rendered(site: str) -> str:
    cfg = load_job_config(ROOT / "examples" / f"{CASES[site]}.yaml")
    prof = load_profile(site)
    job = resolve(cfg, prof, run_dir=f"/scratch/runs/{cfg.name}", default_python=PYTHON)
    return render_sbatch(job, prof)


def assert_same_lines(actual: str, golden: Path) -> None:
    if os.environ.get("PHOENIX_UPDATE_GOLDEN") == "1":
        golden.write_text(actual)
    assert golden.exists(), f"missing golden file {golden}; create it with PHOENIX_UPDATE_GOLDEN=1"
    exp, act = golden.read_text().splitlines(), actual.splitlines()
    for i, (e, a) in enumerate(zip(exp, act), start=1):
        assert e == a, (
            f"{golden.name} line {i} differs:\n  expected: {e!r}\n  actual:   {a!r}\n"
            "(if the change is intended, regenerate with PHOENIX_UPDATE_GOLDEN=1)"
        )
    assert len(exp) == len(act), (
        f"{golden.name}: expected {len(exp)} lines, got {len(act)}; first extra/missing line: "
        f"{(act[len(exp)] if len(act) > len(exp) else exp[len(act)])!r} (regenerate with PHOENIX_UPDATE_GOLDEN=1)"
    )


@pytest.mark.parametrize("site", sorted(CASES))
def test_golden(site):
    assert_same_lines(rendered(site), GOLDEN / f"{site}.sbatch")


def sbatch_opts(text: str) -> list[str]:
    return [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def srun_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith("srun "))


def test_options_that_phoenix_relies_on():
    for site in CASES:
        text = rendered(site)
        opts = sbatch_opts(text)
        cfg, prof = load_job_config(ROOT / "examples" / f"{CASES[site]}.yaml"), load_profile(site)
        r = cfg.resilience
        need = r.collective_timeout_s + r.heartbeat_timeout_s + 2 * prof.scheduler.final_write_s
        lead = max(prof.scheduler.signal_before_end_s, -(-need // 1))
        assert {"--no-kill", "--no-requeue", f"--signal=B:USR1@{lead:.0f}"} <= set(opts), (site, opts)
        srun = srun_line(text)
        assert "--no-kill --kill-on-bad-exit=0" in srun
        # coordinator before the one srun step
        assert text.index("phoenix_hpc.control.supervise") < text.index("srun --no-kill")
        assert text.count("\nsrun ") == 1
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    pm = rendered("perlmutter")
    assert {"--nodes=18", "--ntasks-per-node=4", "--constraint=gpu", "--qos=regular", "--gpus-per-node=4",
            "--account=m0000_g"} <= set(sbatch_opts(pm))
    assert "--mpi=cray_shasta" in srun_line(pm) and "--gpu-bind=none" in srun_line(pm)
    assert "export NCCL_SOCKET_IFNAME=hsn" in pm and "module load nccl cudatoolkit" in pm
    lo = rendered("local")
    assert {"--nodes=6", "--ntasks-per-node=1"} <= set(sbatch_opts(lo)) and "--mpi=pmix" in srun_line(lo)


def test_vista_never_renders_gres_mem_or_pinning():
    text = rendered("vista")
    for bad in ("--gres", "--gpus", "--mem", "--nodelist", "--exclude", " -w ", " -x "):
        assert bad not in text
    cfg = load_job_config(ROOT / "examples" / "vista-7b.yaml")
    prof = load_profile("vista")
    job = resolve(cfg, prof, run_dir="/r", default_python=PYTHON)
    with pytest.raises(SubmitError, match="forbids -w/-x"):
        render_sbatch(dataclasses.replace(job, nodelist="c[1-4]"), prof)
    pm = load_profile("perlmutter")
    pjob = resolve(load_job_config(ROOT / "examples" / "perlmutter-7b.yaml"), pm, run_dir="/r",
                   default_python=PYTHON, nodelist="nid[001000-001017]", exclude="nid001020")
    assert {"--nodelist=nid[001000-001017]", "--exclude=nid001020"} <= set(sbatch_opts(render_sbatch(pjob, pm)))


# --- hostile values -------------------------------------------------------------------------------------------

# no "/" so that it can be a file name; the script runs with cwd=tmp_path, where CANARY would appear
HOSTILE = "a b'c\"d; touch CANARY; $(touch CANARY) `touch CANARY` \\$x ${HOME}\n#SBATCH --wrap=oops\nz"


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_hostile_values_stay_inert(tmp_path):
    canary = tmp_path / "CANARY"
    evil = HOSTILE
    run_dir = tmp_path / f"run {evil}"
    run_dir.mkdir()
    pydir = tmp_path / f"py {evil}"
    pydir.mkdir()
    fake_python = pydir / "python"
    _exe(fake_python, """#!/bin/bash
# stand-in for the interpreter: -m MODULE --run-dir DIR
case "$2" in
  phoenix_hpc.control.supervise)
    printf '%s\\0' "$@" > "$4/coordinator.args"; echo '{}' > "$4/coordinator.json"
    trap 'exit 0' TERM; while :; do sleep 0.05; done ;;
  phoenix_hpc.launch.rank)
    printf '%s\\0' "$@" > "$4/rank.args"; env -0 > "$4/rank.env" ;;
esac
""")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "srun", '#!/bin/bash\nprintf "%s\\0" "$@" > "$SRUN_LOG"\n'
                          'while [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    _exe(bindir / "module", '#!/bin/bash\nprintf "%s\\0" "$@" > "$MODULE_LOG"\n')

    base = load_profile("local").model_dump()
    base["environment"] = {"modules": [evil, "plain"], "env": {"EVIL_VALUE": evil, "OMP_NUM_THREADS": "1"}}
    base["launcher"]["extra_srun"] = [f"--comment={evil}"]
    prof = SiteProfile.model_validate(base)
    cfg = load_job_config(ROOT / "examples" / "gpt-small.yaml")
    cfg = cfg.model_copy(update={"name": evil})
    job = resolve(cfg, prof, run_dir=str(run_dir), default_python=str(fake_python))
    text = render_sbatch(job, prof)

    # sbatch reads only the leading comment block: every #SBATCH line is there, safe, and counted as usual
    lines = text.splitlines()
    header_end = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(not ln.startswith("#SBATCH") for ln in lines[header_end:]), "an #SBATCH line after the header"
    assert all(re.match(r"^#SBATCH --[a-z-]+(=[A-Za-z0-9_.,:@%+=/&|\[\]*!-]+)?$", ln)
               for ln in lines[:header_end] if ln.startswith("#SBATCH"))
    assert f"#SBATCH --job-name={slurm_job_name(evil)}" in lines
    assert not any(ln.startswith("#SBATCH --output") for ln in lines)  # unsafe path: passed on the command line
    assert sbatch_cli_args(job) == [f"--output={str(run_dir).replace('%', '%%')}/slurm-%j.out"]

    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SRUN_LOG": str(tmp_path / "srun.args"),
           "MODULE_LOG": str(tmp_path / "module.args"), "SLURM_JOB_ID": "1"}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not canary.exists(), "a hostile value was executed"

    def nul_list(p: Path) -> list[str]:
        return p.read_text().split("\0")[:-1]

    assert nul_list(run_dir / "rank.args") == ["-m", "phoenix_hpc.launch.rank", "--run-dir", str(run_dir)]
    # the coordinator under its supervisor, which restarts it after a crash (resilience.coordinator_restarts)
    assert nul_list(run_dir / "coordinator.args") == ["-m", "phoenix_hpc.control.supervise", "--run-dir", str(run_dir),
                                                      "--restarts", str(cfg.resilience.coordinator_restarts)]
    rank_env = dict(kv.split("=", 1) for kv in nul_list(run_dir / "rank.env"))
    assert rank_env["EVIL_VALUE"] == evil and rank_env["PHOENIX_JOB_NAME"] == evil
    assert rank_env["RUN_DIR"] == str(run_dir)
    assert nul_list(tmp_path / "module.args") == ["load", evil, "plain"]
    srun_args = nul_list(tmp_path / "srun.args")
    assert f"--comment={evil}" in srun_args and str(fake_python) in srun_args
    assert (run_dir / "logs" / "coordinator.log").exists()


def test_job_name_sanitised():
    assert slurm_job_name("gpt 7b; rm -rf /") == "gpt_7b__rm_-rf__"
    assert slurm_job_name("") == "phoenix"


def test_the_warning_lead_covers_the_stop_round_and_twice_the_measured_write():
    from phoenix_hpc.config.resolve import warning_lead_s

    assert warning_lead_s(120, 30.0, 30.0, 10.0) == 120  # 30 + 10 + 60 = 100 <= the site's 120
    assert warning_lead_s(120, 45.5, 120.0, 30.0) == 241  # 120 + 30 + 91
    assert warning_lead_s(0, 0.2, 8.0, 4.0) == 13  # rounded up


def test_a_chained_run_queues_its_next_job_first_and_cancels_it_when_the_run_finished():
    cfg = load_job_config(ROOT / "examples" / "gpt-small.yaml")
    prof = load_profile("local")
    plain = render_sbatch(resolve(cfg, prof, run_dir="/scratch/runs/x", default_python=PYTHON), prof)
    assert "phoenix_hpc.cli.chain" not in plain
    data = cfg.model_dump(mode="json")
    data["resources"]["chain"] = 2
    chained = type(cfg).model_validate(data)
    text = render_sbatch(resolve(chained, prof, run_dir="/scratch/runs/x", default_python=PYTHON), prof)
    start = text.index("phoenix_hpc.cli.chain start")
    assert start < text.index("phoenix_hpc.control.supervise") < text.index("srun --no-kill")
    end = text.index("phoenix_hpc.cli.chain end")
    assert text.index("COORDINATOR_RC=$(cat") < end < text.index('exit "$COORDINATOR_RC"')
    assert 'if [ "$CHAIN_RC" -eq 4 ]; then exit 0; fi' in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def _env_after(lines: list[str], environ: dict[str, str]) -> str:
    """THP_MEM_ALLOC_ENABLE after bash ran ``lines`` in ``environ`` ("unset" when not set)."""
    script = "\n".join(lines) + '\necho "${THP_MEM_ALLOC_ENABLE-unset}"\n'
    env = {"PATH": os.environ["PATH"], **environ}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_torch_huge_pages_are_asked_for_only_when_the_profile_turns_them_on_and_the_submitter_has_not_set_them():
    from phoenix_hpc.profiles.model import LauncherProfile
    from phoenix_hpc.slurm.render import environment_lines

    assert LauncherProfile.model_fields["torch_huge_pages"].default is False  # the default: off
    off = load_profile("local")
    assert off.launcher.torch_huge_pages is False
    assert not any("THP_MEM_ALLOC_ENABLE" in ln for ln in environment_lines(off))
    assert _env_after(environment_lines(off), {}) == "unset"
    prof = off.model_copy(update={"launcher": off.launcher.model_copy(update={"torch_huge_pages": True})})
    lines = environment_lines(prof)
    assert _env_after(lines, {}) == "1"
    assert _env_after(lines, {"THP_MEM_ALLOC_ENABLE": "0"}) == "0"  # the submitting environment's value is kept
    # set but empty in the submitting environment: kept as it is (torch reads it as off)
    assert _env_after(lines, {"THP_MEM_ALLOC_ENABLE": ""}) == ""
    # the job script carries exactly these lines
    job = resolve(load_job_config(ROOT / "examples" / "gpt-small.yaml"), prof, run_dir="/scratch/runs/x",
                  default_python=PYTHON)
    text = render_sbatch(job, prof)
    assert "\n".join(lines) in text


def _profile_file(tmp_path, launcher: dict | None = None, env: dict | None = None) -> str:
    import yaml

    raw = yaml.safe_load((ROOT / "sites" / "local.yaml").read_text())
    raw["launcher"].update(launcher or {})
    raw["environment"]["env"].update(env or {})
    p = tmp_path / "site.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_a_non_boolean_torch_huge_pages_is_refused(tmp_path):
    from phoenix_hpc.errors import ProfileError

    with pytest.raises(ProfileError, match="launcher.torch_huge_pages"):
        load_profile(_profile_file(tmp_path, launcher={"torch_huge_pages": "yes"}))


def test_a_site_variable_that_contradicts_torch_huge_pages_is_refused(tmp_path):
    """The field renders the variable; a site that also sets it in environment.env would silently override
    it, so the profile must say one thing: with the field on, the variable is refused there."""
    from phoenix_hpc.errors import ProfileError

    with pytest.raises(ProfileError, match="environment.env.*THP_MEM_ALLOC_ENABLE.*launcher.torch_huge_pages"):
        load_profile(_profile_file(tmp_path, launcher={"torch_huge_pages": True}, env={"THP_MEM_ALLOC_ENABLE": "0"}))
    # with the field off the site sets the variable itself, and the job script carries the site's value
    prof = load_profile(_profile_file(tmp_path, launcher={"torch_huge_pages": False},
                                      env={"THP_MEM_ALLOC_ENABLE": "0"}))
    from phoenix_hpc.slurm.render import environment_lines

    assert _env_after(environment_lines(prof), {}) == "0"


def test_torch_honours_the_variable(tmp_path):
    """What the rendered line relies on: torch's CPU allocator asks for huge pages for >= 2 MiB when
    THP_MEM_ALLOC_ENABLE=1 (seen in /proc/self/smaps_rollup), and not without it. Where the kernel's THP mode
    is ``never`` no process gets any, with or without the variable; where it is ``always`` every process may
    get them, with or without it."""
    import sys

    from phoenix_hpc.profiles.model import TORCH_THP_VARIABLE
    from phoenix_hpc.slurm.procs import thp_mode

    mode = thp_mode() or "never"
    probe = ("import os, torch\n"
             "from phoenix_hpc.slurm.procs import resident_mib\n"
             "t = torch.ones(64 << 18)\n"  # 64 MiB of float32, touched
             "print(resident_mib(os.getpid())[1])\n")

    def huge_mib(value: str | None) -> float:
        env = {k: v for k, v in os.environ.items() if k != TORCH_THP_VARIABLE}
        if value is not None:
            env[TORCH_THP_VARIABLE] = value
        return float(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                    check=True).stdout)

    on, off = huge_mib("1"), huge_mib(None)
    if mode == "never":
        assert on == off == 0
    else:
        assert on >= 32, f"only {on} MiB of huge pages for a 64 MiB tensor with THP_MEM_ALLOC_ENABLE=1"
    if mode == "madvise":  # only the variable asks for them
        assert off < on


def test_a_site_signal_that_is_no_catchable_signal_is_refused():
    """``scheduler.signal`` goes to ``sbatch --signal`` and bash's ``trap``: a name that is no signal, or one
    no handler can catch, is refused naming the field and the allowed names; SIG is optional."""
    from phoenix_hpc.profiles.model import SchedulerProfile

    assert SchedulerProfile(signal="SIGUSR2").signal == "USR2" and SchedulerProfile(signal="TERM").signal == "TERM"
    for bad in ("FOO", "KILL", "SIGSTOP", "usr1", "10"):
        with pytest.raises(ValueError, match=f"scheduler.signal '{bad}' is not a signal name .allowed: ABRT, "):
            SchedulerProfile(signal=bad)
