"""``phoenix submit``: validate a job config against a site, render the sbatch script, record the run, submit.

Exit codes: 0 submitted (or printed, with ``--dry-run``); 2 bad input (unknown site, malformed YAML, wrong
types, impossible grid, limits exceeded, engine ``megatron`` where it cannot run: no real CUDA GPUs, an
unsupported megatron-core, a model megatron-core cannot build, more GPU memory than the site's GPU has, more
host memory for PHOENIX's buffers per node than the site's node.mem_gb leaves after its headroom; sbatch
refused the job; a heartbeat interval or timeout the coordinator cannot serve for the job's slot count, by the
control-plane benchmark's numbers, :mod:`phoenix_hpc.control.capacity`; a checkpoint folder whose newest
complete checkpoint, which the job's ranks would load at start-up, is at or past ``training.steps`` or was
trained with another learning-rate schedule, :mod:`phoenix_hpc.recovery.continuation`) with a message naming
the field. A
heartbeat load above half a core, or beyond the simulated slot counts, is a warning.

The script's header (printed by ``--dry-run``), the table after a submit and ``--json`` give the planned host
memory per node (:mod:`phoenix_hpc.config.host_memory`) and, where the site profile sets ``node.mttf_h``, the
node failures expected over the time limit and the spares needed (:mod:`phoenix_hpc.model.spares`); every
warning is printed to stderr and listed in ``--json``'s ``warnings``.

Files written into the run directory (mode 0700; each file written to a temporary name and renamed, and
removed again if sbatch refuses the job): ``job.sbatch`` (the script), ``config.yaml`` (the resolved config,
loadable with :func:`phoenix_hpc.config.load_job_config`) and, once submitted, ``job.json``
(``{"job_id", "site", "submitted_at", "failure_domain_levels", "jobs": [{"job_id", "submitted_at",
"resume_step"}, ...]}``: the run's jobs, oldest first).

``--resume RUN_DIR`` continues a stopped run in a new Slurm job from its newest complete checkpoint: same
run directory, its ``config.yaml`` (or CONFIG, which must keep the grid), same site unless ``--site`` says
otherwise (:mod:`phoenix_hpc.cli.resume` lists what is refused).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import click
import yaml
from pydantic import ValidationError

from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.resolve import ResolvedJob, resolve
from phoenix_hpc.data.format import check_indexed_dataset, sequence_count, vocab_problem
from phoenix_hpc.data.split import split_problem
from phoenix_hpc.errors import ConfigError, DataError, ProfileError, SlurmError, SubmitError
from phoenix_hpc.profiles import load_profile
from phoenix_hpc.slurm.render import render_sbatch, sbatch_cli_args

SCRIPT_NAME = "job.sbatch"
CONFIG_NAME = "config.yaml"
JOB_NAME = "job.json"


def default_run_dir(name: str, cwd: Path, now_s: float, run_root: str | None = None,
                    environ: dict[str, str] | None = None) -> Path:
    """``RUN_ROOT/<name>-<YYYYmmdd-HHMMSS>`` (the name reduced to a safe file name). ``run_root``: the site
    profile's ``scheduler.run_root`` with ``$VARS`` expanded from ``environ`` (a site's scratch file
    system: a checkpoint of a 7B model is about 100 GB); none: ``CWD/runs``.

    Raises:
        SubmitError: ``run_root`` names a variable that is not set.
    """
    import re

    env = os.environ if environ is None else environ
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:64] or "job"
    leaf = f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now_s))}"
    if not run_root:
        return cwd / "runs" / leaf
    missing = [m[0] or m[1] for m in re.findall(r"\$\{(\w+)\}|\$(\w+)", run_root) if not env.get(m[0] or m[1])]
    if missing:
        raise SubmitError(f"scheduler.run_root {run_root!r} of the site profile: ${missing[0]} is not set here; "
                          "pass --run-dir, or set run_dir in the config")
    root = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env[m.group(1) or m.group(2)], run_root)
    return cwd / root / leaf


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename (never half-written)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def resolved_config_yaml(job: ResolvedJob) -> str:
    """The resolved job config as YAML (what :func:`load_job_config` reads back)."""
    return yaml.safe_dump(job.config.model_dump(mode="json"), sort_keys=False)


def _names_user_code(cfg) -> bool:
    """Whether the config names code of the user's (a non-built-in engine, a factory or a provider): only then
    does submit import torch and that code."""
    from phoenix_hpc.engines.user_code import is_builtin_engine

    return (not is_builtin_engine(cfg.engine) or cfg.model.factory is not None or cfg.model.provider is not None
            or cfg.data.factory is not None)


def with_option(cfg, option: str, path: tuple[str, str], value):
    """``cfg`` with the field at ``path`` (section, field) set to ``value`` from the command-line ``option``,
    validated again (its relations, e.g. warm-up < steps).

    Raises:
        ConfigError: naming ``option``, the value and what is allowed.
    """
    from phoenix_hpc.config.schema import JobConfig

    data = cfg.model_dump(mode="json")
    data[path[0]][path[1]] = value
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        from phoenix_hpc.config.load import format_validation_error

        raise ConfigError([f"{option}: {value} is not allowed: {p}" for p in format_validation_error(exc)]) from None


def with_site_levels(cfg, profile):
    """``cfg`` with ``resilience.placement_levels`` set to the site's first two failure-domain levels (node and
    the one above it: switch on local and Perlmutter, leaf on Vista; node alone on a site without another) when
    the config does not give it. The schema's own default, ``[node, switch]``, names a level Vista does not have,
    so a config without the field (every config ``phoenix config from-megatron`` writes) was refused there. A
    config that gives the field is returned as it is, and checked against the site as written."""
    if "placement_levels" in cfg.resilience.model_fields_set:
        return cfg
    levels = list(profile.failure_domains.levels[:2])
    return cfg.model_copy(update={"resilience": cfg.resilience.model_copy(update={"placement_levels": levels})})


def with_steps(cfg, steps: int):
    """``cfg`` with ``training.steps = steps`` (:func:`with_option` for ``--steps``)."""
    return with_option(cfg, "--steps", ("training", "steps"), steps)


def with_chain(cfg, chain: int):
    """``cfg`` with ``resources.chain = chain`` (:func:`with_option` for ``--chain``)."""
    return with_option(cfg, "--chain", ("resources", "chain"), chain)


def _with_config_problems(site_exc: ProfileError, point, config: Path | None) -> ConfigError:
    """``site_exc`` (the site profile cannot be used: unknown site, or a profile file with problems, named)
    plus what loading ``config`` finds on its own (missing file, YAML, schema), so that both are listed at
    once; the checks of the config against a site run once the profile can be used."""
    problems = [p if site_exc.source is None else f"site profile {site_exc.source}: {p}" for p in site_exc.problems]
    if point is None and config is not None:
        try:
            load_job_config(config)
        except ConfigError as exc:
            problems += [p if exc.source is None else f"{exc.source}: {p}" for p in exc.problems]
    return ConfigError(problems, note="not checked yet: the config against the site; that runs once the site "
                                      "profile can be used")


def _with_site_problems(exc: ConfigError, config: Path, profile) -> ConfigError:
    """``exc`` (schema problems) plus the site checks' problems of the rest of the config
    (:func:`phoenix_hpc.config.partial.without_invalid_fields`), so that all problems are listed at once."""
    from phoenix_hpc.config.load import read_yaml
    from phoenix_hpc.config.partial import about_dropped, relative_data_path, without_invalid_fields

    cfg, dropped, revealed = without_invalid_fields(read_yaml(config))
    revealed = [p for p in revealed if p not in exc.problems]
    if cfg is None:
        return ConfigError(exc.problems + revealed, exc.source,
                           note=f"not checked yet: the config against site {profile.name!r} (grid vs GPUs per node, "
                                "node, spare and time limits); that runs once the problems above are fixed")
    try:
        resolve(relative_data_path(cfg, config), profile, run_dir="/", default_python=sys.executable)
        more: list[str] = []
    except ConfigError as site_exc:
        more = [p for p in site_exc.problems if not about_dropped(p, dropped) and p not in exc.problems]
    more = revealed + [p for p in more if p not in revealed]
    return ConfigError(exc.problems + more, exc.source,
                       note=f"also checked against site {profile.name!r}, with {', '.join(dropped)} left out (defaults "
                            "used)" + ("" if more else ": no further problems"))


def python_missing(python: str | None) -> str | None:
    """What is wrong with ``--python`` here (None when it is not given, or is an executable file or a command
    on this machine's PATH, ``shutil.which``): the interpreter the batch script starts the coordinator and the
    ranks with. Only this machine is looked at; the compute nodes of a site other than ``local`` may differ."""
    import shutil

    if python is None or shutil.which(python) is not None:
        return None
    return f"--python: {python!r} is not an executable file or a command on PATH"


def test_env_warnings(environ) -> list[str]:
    """The warning for test-only variables set in the submitting environment, which sbatch's default
    ``--export=ALL`` (sbatch(1)) passes into the job (:mod:`phoenix_hpc.test_env`); none when none is set.

    Raises:
        SubmitError: one of them has a value that is not allowed, or an unknown ``PHOENIX_TEST_*`` name.
    """
    from phoenix_hpc.test_env import TestEnvError, active_test_env, describe

    try:
        active = active_test_env(environ)
    except TestEnvError as exc:
        raise SubmitError(f"{exc}; see docs/design.md section 9 (test-only variables)") from None
    if not active:
        return []
    return ["test-only variables are set and sbatch --export=ALL carries them into the job: " + describe(active)
            + "; the coordinator journals them and phoenix status shows them (unset them for a production job)"]


def _echo_warnings(warnings: list[str]) -> None:
    for w in warnings:
        click.echo(f"warning: {w}", err=True)


def node_shortfall(job: ResolvedJob, usable: int, total: int, partition: str | None) -> str | None:
    """A warning when Slurm has fewer usable nodes than the job asks for (None when enough). Pure."""
    if usable >= job.total_nodes:
        return None
    where = f"partition {partition}" if partition else "the cluster"
    return (f"{where} has {usable} usable node(s) of {total} (the others are down, drained or failed) but the job "
            f"needs {job.total_nodes} ({job.nodes} active + {job.spares} spare): it stays PENDING until enough "
            "nodes are up (`sinfo -R` says why nodes are down; on the local cluster `phoenix cluster revive NODE`)")


def heartbeat_load(job: ResolvedJob):
    """The job's heartbeat load judged against the coordinator's measured capacity
    (:func:`phoenix_hpc.control.capacity.check_heartbeat_load`; every slot, active and spare, heartbeats)."""
    from phoenix_hpc.control.capacity import check_heartbeat_load, load_capacity

    r = job.config.resilience
    slots = job.total_nodes * job.gpus_per_node
    return check_heartbeat_load(slots, r.heartbeat_interval_s, r.heartbeat_timeout_s, load_capacity())


def _node_warning(client, job: ResolvedJob) -> str | None:
    """:func:`node_shortfall` for the cluster ``client`` reaches; None when Slurm cannot be asked (sbatch then
    reports the problem itself)."""
    partition = job.config.resources.partition
    try:
        usable, total = client.node_counts(partition)
    except SlurmError:
        return None
    return node_shortfall(job, usable, total, partition)


def continuation_problems(cfg, root: Path, step: int | None, resuming: bool) -> list[str]:
    """What keeps a fresh submit (not ``resuming``) from continuing from the newest complete checkpoint
    ``step`` of its checkpoint folder ``root``, which its ranks load at start-up when persistent checkpoints
    are on: no step left to train, or another learning-rate schedule than the one it was trained with
    (:mod:`phoenix_hpc.recovery.continuation`). Empty for ``--resume`` (checked by
    :func:`phoenix_hpc.cli.resume.check_resume`), without a checkpoint, or with persistent checkpoints off."""
    from phoenix_hpc.recovery.continuation import checkpoints_on, nothing_left, schedule_problems

    if resuming or step is None or not checkpoints_on(cfg):
        return []
    why = nothing_left(root, step, cfg.training.steps, resuming=False)
    return [why] if why else schedule_problems(root, step, cfg.training, resuming=False)


#: ``--resume`` given without RUN_DIR (click's ``flag_value``; not a path a user would name)
LATEST_RUN = ":latest-run:"


@click.command("submit")
@click.option("--site", default=None, metavar="NAME|PATH",
              help="site profile: a name in sites/ or a YAML file (with --resume: default the run's site)")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--resume", "resume", type=click.Path(file_okay=False, path_type=Path), default=None,
              is_flag=False, flag_value=LATEST_RUN, metavar="[RUN_DIR]",
              help="continue this stopped run from its newest complete checkpoint, in a new job (without RUN_DIR: "
                   "your most recent job of the Slurm cluster this command talks to, as phoenix status)")
@click.option("--dry-run", is_flag=True, help="print the script; submit nothing and write nothing (except --output)")
@click.option("--data-on-cluster", is_flag=True,
              help="the dataset (data.path, data.blend paths) and the Megatron-LM checkpoint to start from "
                   "(resilience.checkpoint.load_megatron) are not readable here, only on the cluster's file systems: "
                   "do not refuse them (the ranks check them before they train; a warning names what was not "
                   "checked); not on site local, whose compute nodes are this machine")
@click.option("--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the script to this file")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory (default: run_dir of the config, else runs/<name>-<timestamp>)")
@click.option("--python", "python", default=None, help="python on the compute nodes (default: this interpreter)")
@click.option("--nodelist", default=None, help="sbatch -w hostlist (only where the site allows it)")
@click.option("--exclude", default=None, help="sbatch -x hostlist (only where the site allows it)")
@click.option("--steps", type=int, default=None,
              help="train this many steps instead of the config's training.steps (e.g. a longer job to follow)")
@click.option("--chain", type=int, default=None, metavar="N",
              help="let the run continue itself in up to N more jobs when a job ends before the last step "
                   "(instead of the config's resources.chain; at most the site's scheduler.max_chain)")
@click.option("--json", "as_json", is_flag=True, help="print a JSON object instead of text")
def submit(site, config, dry_run, output, run_dir, python, nodelist, exclude, steps, as_json, resume, chain,
           data_on_cluster):
    """Validate CONFIG for a site, render its sbatch script, record the run directory and submit it."""
    point = None
    run_root_warning = None  # --dry-run where the site's run_root names a variable not set here
    if resume is not None:
        from phoenix_hpc.cli.resume import check_resume
        from phoenix_hpc.slurm.client import SlurmClient

        if run_dir is not None:
            raise SubmitError("--run-dir: not allowed with --resume (a resumed run stays in its run directory)")
        if str(resume) == LATEST_RUN:  # --resume without RUN_DIR: the default job (status/runs.py)
            from phoenix_hpc.errors import StatusError
            from phoenix_hpc.status.runs import default_run

            try:
                resume = default_run(slurm=SlurmClient())
            except StatusError as exc:
                raise SubmitError(f"--resume: {exc}") from None
            click.echo(f"--resume: the most recent job of this cluster: {resume}", err=True)
        point = check_resume(resume, config, slurm=SlurmClient(), steps=steps)
        site = site or point.site
        run_dir = point.run_dir
    if site is None:
        raise SubmitError("--site: missing; name a site profile (e.g. --site local)")
    if config is None and point is None:
        raise SubmitError("CONFIG: missing; pass a job config file, or --resume RUN_DIR")
    try:
        profile = load_profile(site)
    except ProfileError as site_exc:  # the config's own problems are listed with it, all at once
        raise _with_config_problems(site_exc, point, config) from None
    try:
        cfg = point.config if point is not None else load_job_config(config)
    except ConfigError as exc:
        if exc.source is None:  # the file itself (missing, not YAML): nothing more to say
            raise
        raise _with_site_problems(exc, config, profile) from None
    cfg = with_site_levels(cfg, profile)
    if steps is not None:
        cfg = with_steps(cfg, steps)
    if chain is not None:
        cfg = with_chain(cfg, chain)
    cwd = Path.cwd()
    rd = run_dir or (Path(cfg.run_dir) if cfg.run_dir else None)
    if rd is None:
        try:
            rd = default_run_dir(cfg.name, cwd, time.time(), profile.scheduler.run_root)
        except SubmitError as exc:
            if not dry_run:
                raise
            rd = default_run_dir(cfg.name, cwd, time.time())
            run_root_warning = f"{exc}; the script below uses {rd.parent} instead"
    rd = Path(os.path.abspath(cwd / rd))
    from phoenix_hpc.engines.megatron_layout import load_not_checked
    from phoenix_hpc.engines.megatron_spec import submit_problems
    from phoenix_hpc.launch.metrics_log import logging_problems

    on_cluster = data_on_cluster and profile.name != "local"  # site local: its compute nodes are this machine
    from phoenix_hpc.engines.megatron_layout import overwrite_problems
    from phoenix_hpc.recovery.ckpt_files import checkpoint_root, latest_step

    extra = submit_problems(cfg, resuming=point is not None, on_cluster=on_cluster) + logging_problems(cfg)
    own_root = checkpoint_root(cfg, rd)
    own_step = latest_step(own_root)
    extra += overwrite_problems(cfg, resuming=point is not None, has_own_checkpoint=own_step is not None)
    extra += continuation_problems(cfg, own_root, own_step, resuming=point is not None)
    job = resolve(cfg, profile, run_dir=str(rd), default_python=sys.executable, python=python,
                  nodelist=nodelist, exclude=exclude, extra_problems=extra)
    load = heartbeat_load(job)
    if load.problems:
        raise ConfigError(list(load.problems), str(config) if config is not None else None)
    if point is not None:
        from phoenix_hpc.recovery.ckpt_files import check_checkpoint

        problems = check_checkpoint(point.root, point.step, (job.tp, job.pp, job.dp), verify=False,
                                    engine=cfg.engine)
        if problems:
            raise SubmitError("--resume: " + "; ".join(problems))
    script = render_sbatch(job, profile)
    warnings = list(job.warnings) + list(load.warnings) + ([run_root_warning] if run_root_warning else [])
    unchecked = load_not_checked(cfg, resuming=point is not None, on_cluster=on_cluster)
    if unchecked is not None:
        warnings.append(unchecked)
    warnings += test_env_warnings(os.environ)
    if point is not None:  # --resume trains on with the config's schedule: said, not refused
        from phoenix_hpc.recovery.continuation import schedule_problems

        warnings += schedule_problems(point.root, point.step, cfg.training, resuming=True)
    if _names_user_code(cfg):  # the ranks import it the same way (python_path) before they train
        from phoenix_hpc.engines.factory import check_user_code

        try:
            check_user_code(cfg)
        except Exception:
            _echo_warnings(warnings)
            raise
    problem = None
    try:  # the ranks run the same check before they train; here it costs no queue wait
        for field, prefix in cfg.data.prefix_fields:
            code = check_indexed_dataset(prefix, cfg.model.vocab_size, field)
            problem = problem or vocab_problem(prefix, cfg.model.vocab_size, code)
            if cfg.data.blend is not None:  # a split part without documents: the ranks would refuse the blend
                problem = problem or split_problem(cfg.data.split_text, prefix, sequence_count(prefix, field))
    except DataError as exc:  # a dry run refuses what the submit would
        if not data_on_cluster or profile.name == "local":
            _echo_warnings(warnings)
            local = (" (--data-on-cluster: not on site local, whose compute nodes are this machine)"
                     if data_on_cluster else "")
            raise SubmitError(f"{exc}; it must be readable on a file system the compute nodes see{local}; nothing "
                              f"was {'written' if dry_run else 'submitted'}" + ("" if data_on_cluster else
                              "; a dataset that only the cluster's file systems hold: pass --data-on-cluster")) from None
        warnings.append(f"{exc} (here; --data-on-cluster: the compute nodes must read it)")
    if problem is not None:  # a dataset that is there decides the vocabulary the ranks would refuse: dry run too
        _echo_warnings(warnings)
        raise ConfigError([problem], source=f"job {cfg.name!r}", note="nothing was written or submitted")
    missing = python_missing(python)
    if missing is not None:  # site local: the compute nodes are this machine, so it is certain
        if profile.name == "local":  # a dry run refuses what the submit would
            _echo_warnings(warnings)
            raise SubmitError(f"{missing}; nothing was {'written' if dry_run else 'submitted'}")
        warnings.append(f"{missing} (here; the compute nodes need it)")

    if output is not None:
        try:
            write_atomic(Path(os.path.abspath(output)), script, mode=0o644)
        except OSError as exc:
            raise SubmitError(f"--output: cannot write {str(output)!r}: {exc.strerror}") from None

    if dry_run:
        _echo_warnings(warnings)
        if as_json:
            click.echo(json.dumps(_summary(job, None, script, warnings), indent=2))
        else:
            click.echo(script, nl=False)
        return

    from phoenix_hpc.interrupts import hold_interrupt

    if point is not None:
        _echo_warnings(warnings)
        with hold_interrupt():  # Ctrl-C: the job and its record whole, or the old files back (exit 130)
            return _submit_resumed(point, job, profile, script, as_json, warnings)
    with hold_interrupt():  # Ctrl-C: the run directory with a submitted job recorded, or nothing (exit 130)
        _submit_new(rd, job, profile, script, as_json, warnings)


def _submit_new(rd: Path, job: ResolvedJob, profile, script: str, as_json: bool, warnings: list[str]) -> None:
    """Write the run directory of a new run and submit its job; what was written is removed if sbatch
    refuses it."""
    if (rd / CONFIG_NAME).exists():
        raise SubmitError(f"run_dir: {str(rd)!r} already holds a job ({CONFIG_NAME}); continue it with "
                          f"`phoenix submit --resume {rd}`, or pass another --run-dir")
    created: list[Path] = []
    try:
        for d in reversed([rd, *rd.parents]):
            if not d.exists():
                d.mkdir(mode=0o700)
                created.append(d)
        os.chmod(rd, 0o700)
        write_atomic(rd / CONFIG_NAME, resolved_config_yaml(job))
        write_atomic(rd / SCRIPT_NAME, script, mode=0o700)
    except OSError as exc:
        _undo(rd, created)
        raise SubmitError(f"run_dir: cannot write {str(rd)!r}: {exc.strerror}") from None

    from phoenix_hpc.slurm.client import SlurmClient

    client = SlurmClient()
    shortfall = _node_warning(client, job)
    if shortfall is not None:
        warnings.append(shortfall)
    _echo_warnings(warnings)
    try:
        job_id = client.submit(rd / SCRIPT_NAME, extra_args=sbatch_cli_args(job))
    except SlurmError as exc:
        _undo(rd, created)
        if profile.name == "local" and not os.environ.get("SLURM_CONF"):
            raise SubmitError(f"{exc}\n(site local: SLURM_CONF is not set; start the local cluster with "
                              "`phoenix cluster up` and point Slurm's commands at it with "
                              "eval \"$(phoenix cluster env)\")") from None
        raise
    except BaseException:  # also Ctrl-C (KeyboardInterrupt): no run directory without its job
        _undo(rd, created)
        raise
    submitted_at = time.time()
    write_atomic(rd / JOB_NAME, json.dumps({"job_id": job_id, "site": profile.name, "submitted_at": submitted_at,
                                            "failure_domain_levels": list(profile.failure_domains.levels),
                                            "jobs": [{"job_id": job_id, "submitted_at": submitted_at,
                                                      "resume_step": None, "chain_index": 0}]}))
    from phoenix_hpc.status.runs import record_run

    record_run(rd, job_id, submitted_at=submitted_at)
    if as_json:
        click.echo(json.dumps(_summary(job, job_id, None, warnings), indent=2))
    else:
        _print_submitted(job, job_id)


def _submit_resumed(point, job: ResolvedJob, profile, script: str, as_json: bool, warnings: list[str]) -> None:
    """Submit the next job of a resumed run into its run directory; the old files are put back if sbatch
    refuses it."""
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.runs import record_run

    rd = point.run_dir
    saved = {n: (rd / n).read_text() for n in (CONFIG_NAME, SCRIPT_NAME, JOB_NAME) if (rd / n).exists()}
    try:
        write_atomic(rd / CONFIG_NAME, resolved_config_yaml(job))
        write_atomic(rd / SCRIPT_NAME, script, mode=0o700)
        job_id = SlurmClient().submit(rd / SCRIPT_NAME, extra_args=sbatch_cli_args(job))
    except BaseException as exc:
        for n, text in saved.items():
            write_atomic(rd / n, text, mode=0o700 if n == SCRIPT_NAME else 0o600)
        if isinstance(exc, OSError):
            raise SubmitError(f"--resume: cannot write {str(rd)!r}: {exc.strerror}") from None
        raise
    submitted_at = time.time()
    old = json.loads(saved.get(JOB_NAME, "{}") or "{}")
    jobs = list(old.get("jobs") or ([{"job_id": old["job_id"], "submitted_at": old.get("submitted_at"),
                                       "resume_step": None}] if old.get("job_id") else []))
    jobs.append({"job_id": job_id, "submitted_at": submitted_at, "resume_step": point.step, "chain_index": 0})
    write_atomic(rd / JOB_NAME, json.dumps({**old, "job_id": job_id, "site": profile.name,
                                            "submitted_at": submitted_at, "jobs": jobs,
                                            "failure_domain_levels": list(profile.failure_domains.levels)}))
    record_run(rd, job_id, submitted_at=submitted_at)
    if as_json:
        click.echo(json.dumps({**_summary(job, job_id, None, warnings), "resume_step": point.step,
                               "jobs": [j["job_id"] for j in jobs]}, indent=2))
    else:
        click.echo(f"resuming {rd} from the checkpoint of step {point.step} (jobs so far: "
                   f"{', '.join(j['job_id'] for j in jobs[:-1]) or 'none'})")
        _print_submitted(job, job_id)


def _undo(rd: Path, created: list[Path]) -> None:
    """Remove what this submit wrote (the job files, then the folders it created, if empty)."""
    for name in (SCRIPT_NAME, CONFIG_NAME, JOB_NAME):
        (rd / name).unlink(missing_ok=True)
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            pass


def _summary(job: ResolvedJob, job_id: str | None, script: str | None, warnings: list[str]) -> dict:
    out = {
        "job_id": job_id,
        "run_dir": job.run_dir,
        "site": job.site,
        "name": job.config.name,
        "nodes": job.nodes,
        "spares": job.spares,
        "gpus_per_node": job.gpus_per_node,
        "grid": {"tp": job.tp, "pp": job.pp, "dp": job.dp},
        "time_limit": job.time_limit,
        "chain": job.config.resources.chain,
        "warnings": list(warnings),  # every warning printed to stderr
        "gpu_memory_per_rank_gb": None if job.memory is None else round(job.memory.total / 1e9, 2),
        "host_memory": None if job.host_memory is None else {
            "per_node_gb": round(job.host_memory.per_node / 1e9, 2),
            "per_rank_gb": round(job.host_memory.per_rank / 1e9, 2),
            "budget_gb": None if job.host_memory.budget is None else round(job.host_memory.budget / 1e9, 2),
            "summary": job.host_memory.summary(),
        },
        "node_failures": None if job.spares_plan is None else {
            "expected": job.spares_plan.expected_failures,
            "mttf_node_h": job.spares_plan.mttf_node_h,
            "mttf_source": job.mttf_source,
            "hours": job.spares_plan.hours,
            "target": job.spares_plan.target,
            "spares_needed": job.spares_plan.spares_needed,
            "p_no_shrink": job.spares_plan.p_no_shrink,
            "expected_shrinks": job.spares_plan.expected_shrinks,
            "mean_throughput": job.spares_plan.mean_throughput,
        },
    }
    if script is not None:
        out["script"] = script
    return out


def _print_submitted(job: ResolvedJob, job_id: str) -> None:
    from phoenix_hpc.cli.output import make_console
    from rich.table import Table

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("job id", job_id)
    t.add_row("run dir", job.run_dir)
    t.add_row("site", job.site)
    t.add_row("nodes", f"{job.nodes} active + {job.spares} spare, {job.gpus_per_node} slots each")
    t.add_row("grid", f"tp={job.tp} pp={job.pp} dp={job.dp} ({job.world_size} ranks)")
    t.add_row("time limit", job.time_limit)
    if job.host_memory is not None:
        t.add_row("host memory", job.host_memory.summary())
    if job.spares_plan is not None:
        from phoenix_hpc.slurm.render import failure_line

        t.add_row("node failures", failure_line(job).removeprefix("Node failures expected over the time limit: "))
    if job.config.resources.chain:
        t.add_row("chain", f"up to {job.config.resources.chain} more job(s), each queued at the start of the one "
                           "before (sbatch --dependency=afternotok)")
    console = make_console()
    console.print(f"[green]Submitted[/green] {job.config.name}")
    console.print(t)
