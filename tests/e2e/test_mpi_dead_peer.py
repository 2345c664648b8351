"""MPI when a peer dies, on the real local Slurm cluster (``srun --mpi=pmix``, Open MPI 4.1): the runtime's
communicators return errors instead of aborting the job, the requests a survivor had posted to the dead
peer are cancelled or freed, and the survivors go on in a new generation (docs/design.md section 12)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ASSETS = Path(__file__).parent / "assets"
REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = REPO_ROOT / ".venv" / "bin" / "python"


def test_survivors_of_a_killed_peer_abandon_its_requests_and_continue(slurm_cluster, slurm_env, tmp_path):
    """The transports Open MPI picks, as a job's slots run (no ``OMPI_MCA_btl``): on the local cluster that is
    TCP (PMIx reports every slurmd as a node of its own), the transport between real nodes without a
    high-speed fabric, so pinning it (``OMPI_MCA_btl=self,tcp``) would run the same transport again. That TCP
    carried the job is checked from Open MPI's own words: a survivor that had no connection to the victim yet
    tries to open one for its send and fails ("failed to TCP connect to a peer MPI process"): the transport
    noticed the death, and the job goes on."""
    victim = 2
    env = {k: v for k, v in slurm_env.items() if k != "OMPI_MCA_btl"}
    proc = subprocess.run(
        ["srun", "-N", "4", "--ntasks-per-node=1", "--mpi=pmix", "--no-kill", "--kill-on-bad-exit=0",
         "-t", "00:03:00", str(PYTHON), str(ASSETS / "mpi_dead_peer.py"), str(victim), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    print(out)
    assert len(re.findall(r"STARTED world_rank=\d size=4", proc.stdout)) == 4, out
    survivors = {r["world_rank"]: r for r in
                 (json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("SURVIVOR "))}
    assert sorted(survivors) == [0, 1, 3], out  # the job was not aborted: every survivor finished
    expected_sum = sum(w + 4 for w in (0, 1, 3))
    for w, r in survivors.items():
        assert r["world_returns_errors"] and r["gen0_returns_errors"] and r["gen1_returns_errors"], r
        assert r["posted"] == 2
        a = r["abandon"]
        # every request of the abandoned generation ended: completed (in error or not), cancelled, or freed
        assert a["completed"] + a["cancelled"] + a["freed"] == 3 and a["kept"] == 0, r
        assert r["gen1_size"] == 3 and r["gen1_sum"] == expected_sum, r
        assert r["ring_left"] == {0: 3, 1: 0, 3: 1}[w], r
    assert "task 2: Killed" in proc.stderr, proc.stderr
    assert "failed to TCP connect to a peer MPI process" in proc.stderr, proc.stderr  # TCP was the transport


@pytest.mark.parametrize("detach", [False, True], ids=["in-pmix", "detached"])
def test_a_crash_beside_a_live_slot_cancels_the_step_unless_the_slots_left_pmix(slurm_env, tmp_path, detach):
    """Two nodes with two tasks each; task 1 SIGKILLs itself while task 0 lives on the same node, so that
    node's slurmstepd stays up. In PMIx (as Open MPI leaves it) Slurm's PMIx plugin reports the lost
    connection and cancels the whole step about a second later, ``--no-kill`` notwithstanding: the survivors,
    which wait 4 s before their rounds, are killed. Detached after ``MPI_Init`` (phoenix_hpc/launch/pmix.py,
    what every slot of a job does), the death is not an event: the three survivors finish their rounds."""
    env = dict(slurm_env, SURVIVORS_DETACH="1" if detach else "0", SURVIVORS_HOLD_S="4",
               OMPI_MCA_btl="self,tcp")  # vader between two tasks of one fake node is not what is tested
    proc = subprocess.run(
        ["srun", "-N", "2", "--ntasks-per-node=2", "--mpi=pmix", "--no-kill", "--kill-on-bad-exit=0",
         "-t", "00:02:00", str(PYTHON), str(ASSETS / "mpi_survivors.py"), "1", "3", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=150)
    out = proc.stdout + proc.stderr
    print(out)
    assert len(re.findall(r"STARTED world_rank=\d size=4", proc.stdout)) == 4, out
    survivors = sorted(int(m) for m in re.findall(r"SURVIVOR world_rank=(\d)", proc.stdout))
    if detach:
        assert proc.stdout.count("DETACHED /") == 4, out  # every task found its libpmix and left
        assert survivors == [0, 2, 3] and "ring_ok=1" in proc.stdout, out
        assert "CANCELLED" not in out, out
    else:
        assert survivors == [] and "CANCELLED" in out, out
