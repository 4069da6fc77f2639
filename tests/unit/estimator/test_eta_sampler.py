"""The curve prior's synthetic curves (issue 31): the kinds of training the never-seen families showed the prior
lacked (sudden drops after a plateau, one-cycle and decaying schedules, noise that does not shrink with the loss,
autocorrelated and heavy-tailed noise, EMAs, accuracies in steps of one example, a cadence that changes, targets
met only by noise on a plateau), and the sampler's reproducibility (the build re-trains the prior byte for byte)."""

import math

import numpy as np
import pytest

from services.estimator.model.curveprior import noise, sampler


def test_a_one_cycle_rate_climbs_to_its_peak_then_anneals_far_below_its_start():
    u = np.linspace(0.0, 1.0, 401)
    lr = sampler.schedule(np.random.default_rng(3), u, kind="one-cycle")
    peak = int(np.argmax(lr))
    assert 0 < u[peak] < 0.5 and lr[peak] > 2.5 * lr[0]
    assert np.all(np.diff(lr[: peak + 1]) >= 0) and np.all(np.diff(lr[peak:]) <= 1e-12)
    assert lr[-1] < 0.01 * lr[0]


@pytest.mark.parametrize("kind", sampler.SCHEDULES)
def test_every_schedule_is_a_positive_rate(kind):
    lr = sampler.schedule(np.random.default_rng(0), np.linspace(0.0, 1.0, 50), kind=kind)
    assert np.all(lr > 0) and np.all(np.isfinite(lr))


def test_a_plateau_drops_suddenly_not_gradually():
    u = np.linspace(0.0, 1.0, 2001)
    for seed in range(20):
        standing = sampler.drops(np.random.default_rng(seed), u)
        fall = -np.diff(standing)
        assert standing[0] == pytest.approx(1.0, abs=0.02) and standing[-1] < 0.75
        assert fall.max() * len(fall) > 4 * (standing[0] - standing[-1])  # a drop, not a steady decline


def test_the_noise_scale_follows_the_loss_to_its_power():
    clean = np.geomspace(2.0, 0.02, 100)
    flat = noise.heteroscedastic(clean, power=0.0)
    shrinking = noise.heteroscedastic(clean, power=1.0)
    assert flat == pytest.approx(np.ones(100))  # a plateau near the target keeps the noise of the start
    assert shrinking[-1] == pytest.approx(0.01) and shrinking[0] == pytest.approx(1.0)


def test_autocorrelated_noise_drifts_and_white_noise_does_not():
    rng = np.random.default_rng(1)
    white = noise.innovations(rng, 20_000, kind="gauss")
    drift = noise.innovations(rng, 20_000, kind="gauss", rho=0.9)
    lag1 = [float(np.corrcoef(e[:-1], e[1:])[0, 1]) for e in (white, drift)]
    assert abs(lag1[0]) < 0.03 and lag1[1] == pytest.approx(0.9, abs=0.03)
    assert np.std(drift) == pytest.approx(1.0, abs=0.1)


def test_per_batch_noise_is_heavy_tailed():
    eps = noise.innovations(np.random.default_rng(2), 50_000, kind="heavy")
    kurtosis = float(np.mean((eps - eps.mean()) ** 4) / np.var(eps) ** 2)
    assert kurtosis > 4.0  # a Gaussian's is 3


def test_the_printed_ema_is_the_scripts_recursion():
    values = np.random.default_rng(4).normal(size=50)
    acc, expected = values[0], []
    for v in values:
        acc = 0.9 * acc + 0.1 * v
        expected.append(acc)
    assert noise.ema(values, 0.9) == pytest.approx(expected)


def test_an_accuracy_is_printed_in_steps_of_one_example():
    acc = noise.quantised(np.random.default_rng(5), np.linspace(0.1, 0.9, 40))
    sizes = [n for n in range(50, 5001) if np.allclose(acc * n, np.round(acc * n), atol=1e-6)]
    assert sizes and not np.allclose(
        np.linspace(0.1, 0.9, 40) * sizes[0], np.round(np.linspace(0.1, 0.9, 40) * sizes[0])
    )


def test_a_cadence_can_change_mid_run():
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(400):
        gaps = np.diff(sampler.cadence(rng, 100))
        ratios.append(np.median(gaps[-20:]) / np.median(gaps[:20]))
    assert max(ratios) > 3 and min(ratios) < 1 / 3


def test_a_target_just_below_a_noisy_plateau_is_met_by_noise_first_or_never():
    u = np.linspace(0.01, 1.0, 300)
    clean = np.full(300, 0.5)
    printed = clean + 0.05 * np.random.default_rng(6).standard_normal(300)
    met = never = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        goal, hit = sampler.goal_and_hit(rng, u, clean, printed)
        below = np.flatnonzero(printed <= goal)
        assert hit == (below[0] if len(below) else len(printed))
        if goal < 0.5:  # below the plateau the clean curve never leaves: only the noise can meet it
            met += hit < len(printed)
            never += hit == len(printed)
    assert met > 0 and never > 0


def test_the_sampler_is_reproducible_and_its_truth_is_a_first_crossing():
    first = [s for _ in range(1) for s in sampler.sample(np.random.default_rng(11))]
    again = [s for _ in range(1) for s in sampler.sample(np.random.default_rng(11))]
    assert len(first) == len(again) and all(np.array_equal(a.values, b.values) for a, b in zip(first, again))
    rng = np.random.default_rng(12)
    kinds = {"plateau": 0, "never": 0, "few": 0, "many": 0}
    for _ in range(400):
        for s in sampler.sample(rng):
            oriented = s.values if s.mode == "min" else -s.values
            goal = s.target if s.mode == "min" else -s.target
            assert np.all(oriented > goal) and (s.truth >= s.elapsed or math.isinf(s.truth))
            kinds["never"] += math.isinf(s.truth)
            kinds["few"] += len(s.values) < 15
            kinds["many"] += len(s.values) > 200
    assert kinds["never"] and kinds["few"] and kinds["many"]


def test_pre_training_is_reproducible_to_the_last_weight():
    pytest.importorskip("torch")
    from services.estimator.model.curveprior import train

    first, again = (train.pretrain(curves=200, seed=3, epochs=1, deadline=math.inf) for _ in range(2))
    assert all(
        np.array_equal(a, b) for (wa, ba), (wb, bb) in zip(first.layers, again.layers) for a, b in ((wa, wb), (ba, bb))
    )


def test_a_curve_still_falling_when_the_run_ends_is_not_taught_as_never_meeting_a_target_near_its_end():
    u = np.linspace(0.01, 1.0, 300)
    clean = 0.02 + 2.2 * (1 + 100 * u) ** -0.9  # a clean power law, still falling at the end
    printed = clean + 1e-6 * np.random.default_rng(7).standard_normal(300)
    for seed in range(300):
        goal, hit = sampler.goal_and_hit(np.random.default_rng(seed), u, clean, printed)
        assert hit < len(printed) or goal < 0.9 * clean.min()  # only a target far below it is never met
