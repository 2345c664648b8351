"""The run's jobs as job.json lists them (control/run_jobs.py): a hand-edited file is read, not a crash."""

from __future__ import annotations

import pytest

from phoenix_hpc.control.run_jobs import job_entries


@pytest.mark.parametrize("job, ids", [
    ({"jobs": [{"job_id": "1"}, {"job_id": "2", "after": "1"}]}, ["1", "2"]),
    ({"job_id": 7}, ["7"]),  # one job without the list
    ({"jobs": "1,2", "job_id": 3}, ["3"]),  # not a list: absent
    ({"jobs": {"job_id": "1"}}, []),
    ({"jobs": 5, "job_id": 2}, ["2"]),  # a number: iterating it raised TypeError in phoenix status
    ({"jobs": [5, {"x": 1}, {"job_id": "4"}]}, ["4"]),
])
def test_job_entries_of_a_hand_edited_job_json(job, ids):
    assert [e["job_id"] for e in job_entries(job)] == ids
