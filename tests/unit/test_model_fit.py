"""Scaling fit: the right law wins on synthetic data from each law; extrapolation; input checks."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_hpc.errors import ModelError
from phoenix_hpc.model import fit

TRUTH = {
    "constant": lambda n: 25.0 + 0 * n,
    "linear": lambda n: 10.0 + 0.01 * n,
    "log": lambda n: 2.0 + 4.0 * np.log(n),
    "power": lambda n: 4.0 * n ** 0.3,
}
SIZES = np.repeat(2.0 ** np.arange(5, 13), 3)  # 32 .. 4096 GPUs, 3 recoveries each


@pytest.mark.parametrize("law", sorted(TRUTH))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_picks_the_generating_law(law, seed):
    rng = np.random.default_rng(seed)
    y = TRUTH[law](SIZES) * (1 + 0.03 * rng.standard_normal(SIZES.size))
    r = fit.fit_scaling(SIZES, y)
    assert r.best == law, [(lf.law, round(lf.delta, 2)) for lf in r.laws]
    assert r.criterion == "AICc"
    assert r.laws[0].delta == 0 and r.delta_runner_up > 0
    assert r.evidence_ratio == pytest.approx(np.exp(r.delta_runner_up / 2))
    assert sum(lf.weight for lf in r.laws) == pytest.approx(1.0)
    assert r.laws[0].r2 > 0.9 or law == "constant"


def test_extrapolation_interval_covers_truth_for_the_right_law():
    rng = np.random.default_rng(3)
    y = TRUTH["power"](SIZES) * (1 + 0.02 * rng.standard_normal(SIZES.size))
    r = fit.fit_scaling(SIZES, y, targets=[10_000, 100_000])
    p = r.law("power")
    assert [x.gpus for x in p.predictions] == [10_000, 100_000]
    for x in p.predictions:
        assert x.low < TRUTH["power"](x.gpus) < x.high
        assert x.low < x.seconds < x.high
    # the interval widens with distance from the data
    w = [x.high - x.low for x in p.predictions]
    assert w[0] < w[1]


def test_published_sweep_prefers_growth_over_constant():
    # recovery grew from ~17 s to ~30 s between 64 and 512 GPUs; a constant must not win
    r = fit.fit_scaling([32, 64, 128, 256, 512], [16.0, 17.1, 19.9, 24.6, 29.8])
    assert r.best != "constant"
    assert r.law("constant").weight < 0.05


def test_few_points_uses_aic():
    r = fit.fit_scaling([64, 128, 512], [17.0, 20.0, 30.0])
    assert r.criterion == "AIC"


@pytest.mark.parametrize("gpus, secs, match", [
    ([64, 128], [17.0, 20.0], "at least 3"),
    ([64, 64, 64], [17.0, 18.0, 19.0], "distinct sizes"),
    ([64, 128, 256], [17.0, -1.0, 19.0], "seconds"),
    ([64, 128, 256], [17.0, 0.0, 19.0], "seconds"),
    ([64, 0, 256], [17.0, 18.0, 19.0], "gpus"),
    ([64, 12.5, 256], [17.0, 18.0, 19.0], "gpus"),
])
def test_bad_points(gpus, secs, match):
    with pytest.raises(ModelError, match=match):
        fit.fit_scaling(gpus, secs)


def test_bad_target():
    with pytest.raises(ModelError, match="--target-gpus"):
        fit.fit_scaling([64, 128, 256], [17.0, 18.0, 19.0], targets=[0])


def test_read_csv(tmp_path):
    p = tmp_path / "sizes.csv"
    p.write_text("gpus,seconds,note\n64,17.1,a\n128,20.0,b\n\n512,29.8,c\n")
    assert fit.read_csv(p) == ([64.0, 128.0, 512.0], [17.1, 20.0, 29.8])
    p.write_text("nodes,seconds\n16,17.1\n")
    with pytest.raises(ModelError, match="missing column.*gpus"):
        fit.read_csv(p)
    p.write_text("gpus,seconds\n64,fast\n")
    with pytest.raises(ModelError, match="line 2"):
        fit.read_csv(p)
    p.write_text("gpus,seconds\n")
    with pytest.raises(ModelError, match="no data rows"):
        fit.read_csv(p)
    p.write_text("")
    with pytest.raises(ModelError, match="--csv file .* is empty"):
        fit.read_csv(p)
    with pytest.raises(ModelError, match="--csv"):
        fit.read_csv(tmp_path / "absent.csv")
