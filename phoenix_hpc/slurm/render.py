"""The sbatch script of a PHOENIX job, as a pure function of (resolved job, site profile, run directory).

What the script does (docs/design.md section 7), in order:

1. asks for ``nodes + spares`` nodes with ``--no-kill --no-requeue`` (sbatch(1): without ``--no-kill`` a node
   failure ends the job as NODE_FAIL, and Slurm then requeues it) and ``--signal=B:<SIG>@<s>`` so the batch
   shell is warned ``s`` seconds before the time limit; it forwards the signal to the coordinator;
2. with ``launcher.torch_huge_pages`` (off by default) exports ``THP_MEM_ALLOC_ENABLE=1`` unless set already;
   loads the site's modules and exports the site's environment (:func:`environment_lines`);
3. for a chained run (``resources.chain`` > 0) checks what this job continues and queues the next job of
   the chain (``phoenix_hpc.cli.chain start``: ``sbatch --dependency=afternotok:THIS_JOB``); then
   starts the coordinator in the background under its supervisor (:mod:`phoenix_hpc.control.supervise`,
   which restarts it after a crash, at most ``resilience.coordinator_restarts`` times) and waits (bounded) for
   ``RUN_DIR/coordinator.json``;
4. runs ONE srun step over all nodes with ``--no-kill --kill-on-bad-exit=0`` (srun(1): only the dead node's
   tasks end, the step goes on), the site's ``--mpi`` plugin and GPU binding; slots on spare nodes start in
   standby (the rank launcher decides from ``SLURM_NODEID``);
5. ends the srun step if slots still run :func:`step_grace_s` seconds after the coordinator exited (a
   stopped or hung process never exits by itself, and would hold the allocation until the time limit);
6. with ``resilience.checkpoint.restart: in-job`` (mode checkpoint-restart), when the coordinator asked for an
   in-job restart (:mod:`phoenix_hpc.control.in_job`): ends the step at once and runs steps 3-5 again inside
   the allocation, on its nodes without the dead ones (new srun step, new coordinator); the ranks restore
   the newest persistent checkpoint;
7. stops the coordinator, and for a chained run (``resources.chain``) cancels the next job when the run
   finished (step 0 queued it: ``phoenix_hpc.cli.chain``), and exits with the job's status: 0 when the coordinator recorded ``job_done``
   (training finished, also after hot swaps: the lost slots' exit codes make srun's status non-zero, and
   ``--dependency=afterok`` chains, ``sacct`` and mails must see a finished job), else srun's status
   (or the coordinator's, 1 failed / 3 stopped, when srun's is 0).

Quoting: ``#SBATCH`` lines are parsed by sbatch, not bash, so values there are restricted to a safe charset
(checked by :func:`phoenix_hpc.config.resolve.resolve`; the job name is reduced to ``[A-Za-z0-9._-]``; a run
directory outside the safe charset is passed by ``phoenix submit`` on the sbatch command line instead, see
:func:`sbatch_cli_args`). Everything in the bash body comes from the user or the profile and is quoted with
:func:`shlex.quote` (ANSI-C ``$'...'`` quoting for values with control characters).
"""

from __future__ import annotations

import re
import shlex

from phoenix_hpc import __version__
from phoenix_hpc.config.resolve import ResolvedJob
from phoenix_hpc.control.protocol import EXIT_STATUS_FILE
from phoenix_hpc.errors import SubmitError
from phoenix_hpc.profiles.model import TORCH_THP_VARIABLE, SiteProfile
from phoenix_hpc.topology import switch_levels_of

_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.,+=/@:-]+$")
COORDINATOR_MODULE = "phoenix_hpc.control.coordinator"
SUPERVISOR_MODULE = "phoenix_hpc.control.supervise"
RANK_MODULE = "phoenix_hpc.launch.rank"
CHAIN_MODULE = "phoenix_hpc.cli.chain"
IN_JOB_MODULE = "phoenix_hpc.control.in_job"
IN_JOB_REQUEST = "in_job_restart.json"  # phoenix_hpc.control.in_job.REQUEST_FILE
COORDINATOR_STOP_GRACE_S = 30


def step_grace_s(heartbeat_timeout_s: float) -> int:
    """Seconds the batch script lets the srun step run on after the coordinator exited, before it ends the
    step with ``scancel --signal=KILL JOBID.0`` (scancel(1): a signal to one step's tasks; SIGKILL also ends
    a stopped process). A live slot exits at the coordinator's ``stop``, or by itself once the coordinator
    has been gone for ``heartbeat_timeout_s`` (its watchdog); three heartbeat timeouts, at least 30 s,
    leave room for both."""
    return max(30, int(-(-3 * heartbeat_timeout_s // 1)))


def slurm_job_name(name: str) -> str:
    """The job name as it goes on the ``#SBATCH --job-name`` line: characters outside ``[A-Za-z0-9._-]``
    become ``_`` (the exact name is kept in the script as ``PHOENIX_JOB_NAME`` and in ``config.yaml``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:128] or "phoenix"


def output_path(run_dir: str) -> str:
    """Slurm's batch output file in ``run_dir`` (``%j`` = job id; a literal ``%`` is written ``%%``)."""
    return f"{run_dir.replace('%', '%%')}/slurm-%j.out"


def sbatch_cli_args(job: ResolvedJob) -> list[str]:
    """Options ``phoenix submit`` adds on the sbatch command line (argv, no shell): the ``--output`` file when
    the run directory cannot be written on an ``#SBATCH`` line."""
    return cli_args_for(job.run_dir)


def cli_args_for(run_dir: str) -> list[str]:
    """:func:`sbatch_cli_args` for a run directory (also used when a chained run queues its next job)."""
    return [] if _SAFE_PATH.match(run_dir) else [f"--output={output_path(run_dir)}"]


def _q(value: object) -> str:
    """Shell-quote ``value`` for bash. Values with control characters (newlines, ...) use ANSI-C quoting
    (``$'...'`` with escapes), so every script line stays one line and no value can start a line of its own
    (e.g. a line ``#SBATCH ...`` inside a quoted value)."""
    s = str(value)
    if not any(ord(c) < 32 or ord(c) == 127 for c in s):
        return shlex.quote(s)
    body = "".join(
        "\\\\" if c == "\\" else "\\'" if c == "'" else f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c
        for c in s
    )
    return f"$'{body}'"


def failure_line(job: ResolvedJob) -> str:
    """One line: node failures expected over the job's time limit and the spares needed (site node.mttf_h)."""
    sp = job.spares_plan
    tag = "published by the site" if job.mttf_source == "published" else "an assumption of the site profile"
    return (f"Node failures expected over the time limit: {sp.expected_failures:.3g} ({sp.nodes} nodes x "
            f"{sp.hours:g} h / node MTTF {sp.mttf_node_h:g} h, {tag}); spares for P(no shrink) >= {sp.target:g}: "
            f"{sp.spares_needed} (this job: {job.spares})")


def environment_lines(profile: SiteProfile) -> list[str]:
    """The lines of a job script that set up the ranks' environment (each group followed by an empty line):
    ``launcher.torch_huge_pages`` (``export THP_MEM_ALLOC_ENABLE=1`` unless the submitting environment sets
    it, also to an empty value: sbatch passes that environment on under its default ``--export=ALL``; torch's
    CPU allocator, c10 ``alloc_cpu`` since torch 2.2 (pytorch#107697), then aligns every allocation of
    >= 2 MiB to 2 MiB and asks for transparent huge pages with ``madvise(MADV_HUGEPAGE)``), then the site's
    modules and variables (``environment``; the profile refuses the same variable there while the field is
    on). Shared by :func:`render_sbatch` and the benchmark's own jobs, so that both run their ranks alike."""
    ln, env = profile.launcher, profile.environment
    out: list[str] = []
    if ln.torch_huge_pages:
        out += [
            "# torch's CPU tensors of >= 2 MiB in transparent huge pages (launcher.torch_huge_pages): a killed",
            "# rank's exit, which its detection waits for, then grows far less with them",
            f'export {TORCH_THP_VARIABLE}="${{{TORCH_THP_VARIABLE}-1}}"',
            "",
        ]
    if env.modules or env.env:
        out.append("# site environment")
    if env.modules:
        out.append("module load " + " ".join(_q(m) for m in env.modules))
    for k, v in env.env.items():
        out.append(f"export {k}={_q(v)}")
    if env.modules or env.env:
        out.append("")
    return out


def render_sbatch(job: ResolvedJob, profile: SiteProfile, run_dir: str | None = None) -> str:
    """The complete batch script text (ends with a newline).

    Args:
        job: the resolved job (:func:`phoenix_hpc.config.resolve.resolve`).
        profile: the site profile it was resolved against.
        run_dir: absolute run directory; defaults to ``job.run_dir``.

    Raises:
        SubmitError: ``job`` was resolved for another site, or asks for node pinning the site forbids.
    """
    if job.site != profile.name:
        raise SubmitError(f"job was resolved for site {job.site!r}, not {profile.name!r}")
    sch, ln = profile.scheduler, profile.launcher
    if (job.nodelist or job.exclude) and not sch.allow_node_pinning:
        raise SubmitError(f"site {profile.name} forbids -w/-x at submission")
    rd = run_dir or job.run_dir
    cfg = job.config
    res = cfg.resources
    gpn = job.gpus_per_node

    out: list[str] = ["#!/bin/bash"]
    out.append(
        f"# PHOENIX job for site {profile.name}: {job.nodes} active + {job.spares} spare nodes, {gpn} slot{'s' if gpn != 1 else ''} per node,"
    )
    out.append(f"# grid tp={job.tp} pp={job.pp} dp={job.dp} ({job.world_size} active ranks), engine {cfg.engine}.")
    out.append(f"# Generated by phoenix_hpc {__version__} for `phoenix submit`, which records the run directory")
    out.append("# (config.yaml) this script reads; sbatch it alone only with that directory in place.")
    if job.memory is not None:
        mem = profile.node.gpu_mem_gb
        out.append(f"# GPU memory per rank, estimated by phoenix_hpc.config.memory"
                   + (f" (one GPU of this site: {mem:g} GB):" if mem is not None else ":"))
        out.append(f"#   {job.memory.summary()}")
    if job.host_memory is not None:
        out.append("# Host memory PHOENIX holds per node, planned by phoenix_hpc.config.host_memory:")
        out.append(f"#   {job.host_memory.summary()}")
    if job.spares_plan is not None:
        out.append("# " + failure_line(job))

    d = [
        f"--job-name={slurm_job_name(cfg.name)}",
        f"--nodes={job.total_nodes}",
        f"--ntasks-per-node={gpn}",
        f"--time={job.time_limit}",
    ]
    for opt, val in (("account", res.account), ("qos", res.qos), ("partition", res.partition),
                     ("constraint", res.constraint)):
        if val:
            d.append(f"--{opt}={val}")
    if sch.request_gpus:
        d.append(f"--gpus-per-node={gpn}")
    if ln.cpus_per_task:
        d.append(f"--cpus-per-task={ln.cpus_per_task}")
    if sch.allow_node_pinning:
        if job.nodelist:
            d.append(f"--nodelist={job.nodelist}")
        if job.exclude:
            d.append(f"--exclude={job.exclude}")
    d += ["--no-kill", "--no-requeue", f"--signal=B:{sch.signal}@{job.warning_lead_s}"]
    if _SAFE_PATH.match(rd):
        d.append(f"--output={output_path(rd)}")
    d += list(sch.extra_sbatch)
    out += [f"#SBATCH {x}" for x in d]
    if not _SAFE_PATH.match(rd):
        out.append("# (batch output: the run directory is passed to sbatch by `phoenix submit` as --output)")

    out += ["", "set -uo pipefail", ""]
    out += [
        f"PHOENIX_JOB_NAME={_q(cfg.name)}",
        f"RUN_DIR={_q(rd)}",
        f"PHOENIX_PYTHON={_q(job.python)}",
        f"ACTIVE_NODES={job.nodes}",
        f"SPARE_NODES={job.spares}",
        f"COORDINATOR_TIMEOUT_S={ln.coordinator_timeout_s}",
        "# the site's switch tiers, leaf first: the names of the SLURM_TOPOLOGY_ADDR components",
        f"PHOENIX_SWITCH_LEVELS={_q(','.join(switch_levels_of(profile.failure_domains.levels)))}",
        "export PHOENIX_JOB_NAME RUN_DIR ACTIVE_NODES SPARE_NODES PHOENIX_SWITCH_LEVELS",
        "",
    ]
    out += environment_lines(profile)

    out += [
        'mkdir -p "$RUN_DIR/logs"',
        'echo "[phoenix] job ${SLURM_JOB_ID:-?} $PHOENIX_JOB_NAME: nodes ${SLURM_JOB_NODELIST:-?}'
        ' ($ACTIVE_NODES active + $SPARE_NODES spare)"',
        "",
    ]
    chain = res.chain > 0
    if chain:
        out += [
            f"# 0. a chained run (resources.chain: {res.chain}): check what this job continues, and queue the next",
            "#    job (sbatch --dependency=afternotok), which starts only if this one ends before the last step",
            f'"$PHOENIX_PYTHON" -m {CHAIN_MODULE} start --run-dir "$RUN_DIR"',
            "CHAIN_RC=$?",
            'if [ "$CHAIN_RC" -eq 4 ]; then exit 0; fi',
            'if [ "$CHAIN_RC" -ne 0 ]; then exit 1; fi',
            "",
        ]
    rz = cfg.resilience
    in_job = bool(rz.enabled and rz.mode == "checkpoint-restart" and rz.checkpoint.restart == "in-job")
    loop_start = len(out)
    out += [
        "# 1. the coordinator (control plane) first, on the batch host, under its supervisor, which restarts it",
        f"#    after a crash (at most {cfg.resilience.coordinator_restarts} times: resilience.coordinator_restarts); "
        "COORDINATOR_PID is the supervisor's",
        f'rm -f "$RUN_DIR/coordinator.json" "$RUN_DIR/{EXIT_STATUS_FILE}"',
        f'"$PHOENIX_PYTHON" -m {SUPERVISOR_MODULE} --run-dir "$RUN_DIR" --restarts {cfg.resilience.coordinator_restarts} '
        '>>"$RUN_DIR/logs/coordinator.log" 2>&1 &',
        "COORDINATOR_PID=$!",
        "stop_coordinator() {",
        '  kill -0 "$COORDINATOR_PID" 2>/dev/null || return 0',
        '  kill -TERM "$COORDINATOR_PID" 2>/dev/null',
        "  # polled every 0.1 s: the job ends as soon as the coordinator did; bash's SECONDS (whole seconds) bounds",
        f"  # the wait to at least {COORDINATOR_STOP_GRACE_S} s",
        f"  local stop_by=$((SECONDS + {COORDINATOR_STOP_GRACE_S}))",
        '  while [ "$SECONDS" -le "$stop_by" ]; do',
        '    kill -0 "$COORDINATOR_PID" 2>/dev/null || return 0',
        "    sleep 0.1",
        "  done",
        '  kill -KILL "$COORDINATOR_PID" 2>/dev/null || true',
        "}",
        "forward_signal() {",
        f'  echo "[phoenix] {sch.signal}: time limit in {job.warning_lead_s} s; telling the coordinator" >&2',
        f'  kill -{sch.signal} "$COORDINATOR_PID" 2>/dev/null || true',
        "}",
        "trap stop_coordinator EXIT",
        f"trap forward_signal {sch.signal}",
        "# polled every 0.1 s: srun starts as soon as the coordinator is ready; bash's SECONDS (whole seconds)",
        "# bounds the wait to at least COORDINATOR_TIMEOUT_S seconds",
        'ready_by=$((SECONDS + COORDINATOR_TIMEOUT_S))',
        'until [ -s "$RUN_DIR/coordinator.json" ]; do',
        '  if ! kill -0 "$COORDINATOR_PID" 2>/dev/null; then',
        '    echo "[phoenix] the coordinator exited before it was ready; see $RUN_DIR/logs/coordinator.log" >&2',
        "    exit 1",
        "  fi",
        '  if [ "$SECONDS" -gt "$ready_by" ]; then',
        '    echo "[phoenix] the coordinator was not ready after $COORDINATOR_TIMEOUT_S s" >&2',
        "    exit 1",
        "  fi",
        "  sleep 0.1",
        "done",
        "",
        "# 2. one srun step over all nodes; slots on the spare nodes start in standby",
    ]
    srun = [
        "srun",
        "--no-kill",
        "--kill-on-bad-exit=0",
        f"--mpi={ln.srun_mpi}",
        f"--nodes={job.total_nodes}" if not in_job else '--nodes="$STEP_NODES"',
        f"--ntasks-per-node={gpn}",
    ]
    if in_job:  # the batch environment's SLURM_NTASKS is the whole allocation's: srun(1) would take it.
        # --overlap (srun(1)): the ended step keeps its resources until its dead node is marked down
        # (SlurmdTimeout); without it the new step waits for "Requested nodes are busy"
        srun += [f'--ntasks="$((STEP_NODES * {gpn}))"', "--overlap",
                 '${STEP_NODELIST:+--nodelist="$STEP_NODELIST"}']
    if sch.request_gpus:
        srun.append(f"--gpus-per-node={gpn}")
    if ln.gpu_bind:
        srun.append(f"--gpu-bind={ln.gpu_bind}")
    if ln.cpus_per_task:
        srun.append(f"--cpus-per-task={ln.cpus_per_task}")
    if ln.cpu_bind:
        srun.append(f"--cpu-bind={ln.cpu_bind}")
    srun += [_q(a) for a in ln.extra_srun]
    out.append(" ".join(srun) + " \\")
    out.append(f'  "$PHOENIX_PYTHON" -m {RANK_MODULE} --run-dir "$RUN_DIR" &')
    grace = step_grace_s(cfg.resilience.heartbeat_timeout_s)
    out += [
        "SRUN_PID=$!",
        "# once the coordinator has ended the job, the slots have STEP_GRACE_S to exit by themselves; a slot",
        "# that cannot (a stopped or hung process) would keep the step, and the allocation, alive: end the step",
        f"STEP_GRACE_S={grace}",
        "end_step_after_coordinator() {",
        '  while kill -0 "$COORDINATOR_PID" 2>/dev/null; do sleep 1; done' if not in_job else
        '  while kill -0 "$COORDINATOR_PID" 2>/dev/null; do sleep 0.1; done',
    ]
    if in_job:
        out += [
            f'  if [ -s "$RUN_DIR/{IN_JOB_REQUEST}" ]; then',
            '    echo "[phoenix] in-job restart: ending step ${SLURM_JOB_ID}.${STEP_NO} now" >&2',
            '    scancel --signal=KILL "${SLURM_JOB_ID}.${STEP_NO}" 2>/dev/null',
            "    for _ in $(seq 20); do",
            '      kill -0 "$SRUN_PID" 2>/dev/null || return 0',
            "      sleep 0.1",
            "    done",
            '    kill -KILL "$SRUN_PID" 2>/dev/null || true',
            "    return 0",
            "  fi",
        ]
    out += [
        "  for _ in $(seq \"$STEP_GRACE_S\"); do",
        '    kill -0 "$SRUN_PID" 2>/dev/null || return 0',
        "    sleep 1",
        "  done",
        '  echo "[phoenix] slots still running $STEP_GRACE_S s after the coordinator ended; ending the step" >&2',
        '  scancel --signal=KILL "${SLURM_JOB_ID}.0" 2>/dev/null' if not in_job else
        '  scancel --signal=KILL "${SLURM_JOB_ID}.${STEP_NO}" 2>/dev/null',
        "  for _ in $(seq 10); do",
        '    kill -0 "$SRUN_PID" 2>/dev/null || return 0',
        "    sleep 1",
        "  done",
        '  kill -KILL "$SRUN_PID" 2>/dev/null || true',
        "}",
        "end_step_after_coordinator &",
        "STEP_WATCH_PID=$!",
        "# wait returns early when a trapped signal arrives; keep waiting until srun itself has ended",
        "while :; do",
        '  wait "$SRUN_PID"',
        "  SRUN_RC=$?",
        '  kill -0 "$SRUN_PID" 2>/dev/null || break',
        "done",
        'echo "[phoenix] srun step ended with status $SRUN_RC"',
        "",
        "# 3. stop the coordinator; the job's status is its verdict: 0 once training finished (job_done),",
        "#    even when slots were lost on the way (their exit codes make srun's status non-zero)",
        'kill "$STEP_WATCH_PID" 2>/dev/null',
        "stop_coordinator",
        'wait "$COORDINATOR_PID"',
        "COORDINATOR_PROCESS_RC=$?",
        "# the verdict the coordinator wrote (0 done, 1 failed, 3 stopped); its process status if it wrote none",
        "COORDINATOR_RC=$COORDINATOR_PROCESS_RC",
        f'if [ -s "$RUN_DIR/{EXIT_STATUS_FILE}" ]; then COORDINATOR_RC=$(cat "$RUN_DIR/{EXIT_STATUS_FILE}"); fi',
        'echo "[phoenix] coordinator verdict $COORDINATOR_RC (process status $COORDINATOR_PROCESS_RC)"',
    ]
    if in_job:
        body = out[loop_start:]
        del out[loop_start:]
        out += [
            "# resilience.checkpoint.restart: in-job. On a fault the coordinator asks for a restart"
            f" ({IN_JOB_REQUEST}):",
            "# the step is ended at once and steps 1-2 run again inside this allocation, on its nodes without the",
            "# dead ones; the new step's ranks restore the newest persistent checkpoint",
            f'rm -f "$RUN_DIR/{IN_JOB_REQUEST}"',
            "STEP_NO=0",
            "STEP_NODES=$((ACTIVE_NODES + SPARE_NODES))",
            "STEP_NODELIST=",
            "while :; do",
        ]
        out += [("  " + x) if x else x for x in body]
        out += [
            f'  NEXT=$("$PHOENIX_PYTHON" -m {IN_JOB_MODULE} next-nodes --run-dir "$RUN_DIR" '
            '--nodes "$SLURM_JOB_NODELIST" --active "$ACTIVE_NODES")',
            "  NEXT_RC=$?",
            '  [ "$NEXT_RC" -eq 0 ] || break',
            '  STEP_NODELIST=${NEXT% *}',
            '  STEP_NODES=$((ACTIVE_NODES + ${NEXT##* }))',
            "  STEP_NO=$((STEP_NO + 1))",
            '  echo "[phoenix] in-job restart: step ${SLURM_JOB_ID}.${STEP_NO} on $STEP_NODELIST"',
            "done",
        ]
    if chain:
        out += ["# the next job of the chain: cancelled when the run finished, else it continues the run",
                f'"$PHOENIX_PYTHON" -m {CHAIN_MODULE} end --run-dir "$RUN_DIR" --status "$COORDINATOR_RC"']
    out += [
        'if [ "$COORDINATOR_RC" -eq 0 ]; then',
        '  [ "$SRUN_RC" -eq 0 ] || echo "[phoenix] training finished (job_done); the step status $SRUN_RC is that of lost slots"',
        "  exit 0",
        "fi",
        'if [ "$SRUN_RC" -ne 0 ]; then exit "$SRUN_RC"; fi',
        'exit "$COORDINATOR_RC"',
    ]
    return "\n".join(out) + "\n"
