#!/usr/bin/env python3
"""What Slurm does when the node running a job's batch script dies (docs/design.md section 7, "Batch-host
loss"), measured on a local cluster of this project's own (Slurm 22.05, SlurmdTimeout 5 s).

A bare job shaped like a PHOENIX job (``--no-kill --no-requeue``, 3 nodes, one ``srun --no-kill`` step of
``sleep``, a time limit of 2 minutes) is submitted; once it runs, its batch host is killed as a failing node
vanishes (its slurmd, slurmstepd and their processes: ``phoenix_hpc.slurm.cluster.kill_node``). The job's
state, its node list and the batch host's state are printed at every change, with the seconds since the
kill, until the job has ended, and then when the nodes it held are idle again.

Run as root from the repository root (it starts a local cluster of its own and stops it at the end; about
3 minutes, mostly waiting for the time limit):

    .venv/bin/python scripts/measure-batch-host-loss.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm.client import SlurmClient

TIME_LIMIT_MIN = 2


def main() -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="phx-bh-"))
    cluster = lc.up(run_dir, nodes=4, switches=2, gpus_per_node=1)
    client = SlurmClient(env=cluster.env)
    try:
        script = run_dir / "job.sh"
        script.write_text("#!/bin/bash\n#SBATCH --nodes=3 --ntasks-per-node=1 --no-kill --no-requeue\n"
                          f"#SBATCH --time={TIME_LIMIT_MIN} --output={run_dir}/job-%j.out\n"
                          "srun --no-kill --kill-on-bad-exit=0 sleep 600\n")
        job = client.submit(script)
        t_submit = time.monotonic()
        while client.show_job(job).get("JobState") != "RUNNING" or len(client.show_steps(job)) < 1:
            if time.monotonic() - t_submit > 60:
                raise SystemExit("the job did not start")
            time.sleep(0.5)
        time.sleep(2)
        rec = client.show_job(job)
        host, nodes = rec["BatchHost"], rec["NodeList"]
        print(f"Slurm {client.slurm_version()}, SlurmdTimeout {cluster.slurmd_timeout_s} s; job {job} on {nodes}, "
              f"batch host {host}, time limit {TIME_LIMIT_MIN} min, running for {rec.get('RunTime')}")
        t0 = time.monotonic()
        lc.kill_node(cluster, host)
        last = None
        while True:
            rec = client.show_job(job)
            ns = (client.show_nodes(host) or [{}])[0].get("State")
            now = (rec.get("JobState"), rec.get("NodeList"), ns, rec.get("Reason"))
            if now != last:
                print(f"{time.monotonic() - t0:7.1f} s  job {now[0]:<11} NodeList {now[1]:<16} batch host {ns:<28} "
                      f"Reason {now[3]}", flush=True)
                last = now
            if now[0] not in ("RUNNING", "COMPLETING", "SIGNALING", "CONFIGURING"):
                break
            time.sleep(0.5)
        t_end = time.monotonic() - t0
        others = [n for n in client.hostnames(nodes) if n != host]
        while any("ALLOC" in (r.get("State") or "") or "COMPLETING" in (r.get("State") or "")
                  for r in client.show_nodes(",".join(others))):
            time.sleep(0.5)
        print(f"job ended {rec.get('JobState')} (ExitCode {rec.get('ExitCode')}) {t_end:.1f} s after the kill; "
              f"its other nodes {','.join(others)} idle {time.monotonic() - t0:.1f} s after the kill")
    finally:
        lc.down(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
