"""The reporter's closing line of a rank (launch/rank_summary.py ``done_line``), also for a job that trained no
step because it started from a checkpoint at its last step."""

from phoenix_hpc.launch.loop import StepTotals
from phoenix_hpc.launch.rank_summary import done_line, done_summary


class _Engine:
    """An engine restored at ``step`` with no state to hash (done_summary reads only these)."""

    def __init__(self, step: int):
        self.step = step

    def optimizer_shard(self):
        return []

    def param_shard(self):
        return []

    def state_hash(self):
        return "ab" * 32


def test_a_job_that_trained_no_step_prints_its_line():
    summary = done_summary(_Engine(300), StepTotals(), tokens_per_step=4096)
    assert summary["mean_step_time_ms"] is None and summary["tokens_per_s"] is None
    line = done_line(summary, rank=0)
    assert line.startswith("done: 300 steps, no step trained in this job")
    assert "ms/step" not in line and "None" not in line
    assert line.endswith("state_hash[rank 0] " + "ab" * 8)


def test_a_job_that_trained_prints_loss_speed_and_hash():
    totals = StepTotals(steps=4, time_ms=200.0, first_loss=10.5, last_loss=9.25)
    line = done_line(done_summary(_Engine(4), totals, tokens_per_step=1000), rank=3)
    assert line == ("done: 4 steps, loss 10.5 -> 9.25, 50.0 ms/step, 20,000 tok/s, "
                    "state_hash[rank 3] " + "ab" * 8)
