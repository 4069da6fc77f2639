"""Which running trials of a search to stop now: pure functions of every trial's metric points, shared by the
search driver and the replay benchmark (bench/search).

Values are oriented lower-is-better (a `max` objective is negated by the caller). Each decision is a function of
the points alone, so a driver that restarts decides the same again (nothing is kept between calls).

- `median`: Optuna's MedianPruner rule: a trial whose best value so far is worse than the median of the completed
  trials' best values at the same step is stopped (after 3 completed trials, past 10% of the run).
- `hyperband`: Optuna's HyperbandPruner (brackets of SuccessiveHalvingPruner, eta 3), ported: Optuna records rung
  values as side effects of each `prune()` call in trial attributes, which a restarted driver would have to replay
  in order; here the same rungs are replayed from the points in time order on every call (see `hyperband`).
- `predicted`: ours: project each running trial's final best value from its partial curve (curvefit.project) and
  stop it when even the optimistic bound is worse, by more than the near-tie margin, than the best value already
  certain (a completed trial's value,
  or a running trial's best so far, which can only improve) or, with `use_projected`, another trial's projection.
  The optimistic bound is the lower of the fit's and of the trial's best so far minus the most any completed
  trial still improved after the same step (a learning-rate schedule's late drops are in the search's history).
"""

import binascii
import math
import statistics
from dataclasses import dataclass, field

from services.submitter.searches.curvefit import project


@dataclass(frozen=True)
class Point:
    t: float
    step: float
    value: float


@dataclass(frozen=True)
class Trial:
    trial: int
    points: tuple[Point, ...]
    done: bool = False  # completed: its whole curve is known
    stopped: bool = False  # pruned or failed: its curve ends early and is no candidate for the best


@dataclass(frozen=True)
class Config:
    """Settings; hyperband's min_resource and predicted's z, reach, history and margin were chosen on the tuning
    searches of bench/search (python -m bench.search --tune), not on the held-out ones."""

    median_startup: int = 3
    median_warmup: float = 0.1
    eta: int = 3
    hb_min_fraction: float = 1 / 9  # min_resource: rungs at 1/9 and 1/3 of the run (2 brackets)
    z: float = 3.0  # residual sigmas in the optimistic bound
    reach: float = 0.25  # times the improvement still visible in the fitted window, scaled by 1 - progress
    min_progress: float = 0.15
    use_projected: bool = False
    margin: float = 0.002  # relative to the bar: an optimistic bound within 0.2% of it is a near-tie, never pruned
    history: float = 0.5  # times the most any completed trial still improved after the same step


def horizon(trials: list[Trial], max_step: float | None) -> float | None:
    """The step a trial ends at: given, or that of the first trial to complete (Optuna's max_resource="auto")."""
    if max_step:
        return max_step
    done = [t for t in trials if t.done and t.points]
    first = min(done, key=lambda t: (t.points[-1].t, t.trial), default=None)
    return first.points[-1].step if first and first.points[-1].step > 0 else None


def final_value(trial: Trial) -> float | None:
    return min((p.value for p in trial.points), default=None)


def held_value(trial: Trial) -> float | None:
    """The best value the trial held over two points in a row (its one point when it completed with one): what
    another trial is measured against. One point alone printed `loss 0.0` and every other trial was pruned for
    not beating it (found by review)."""
    values = [p.value for p in trial.points]
    if len(values) < 2:
        return values[0] if values and trial.done else None
    return min(max(a, b) for a, b in zip(values, values[1:]))


def decide(
    pruner: str,
    trials: list[Trial],
    *,
    max_step: float | None = None,
    key: str = "",
    config: Config = Config(),
    only: set[int] | None = None,
) -> dict[int, str]:
    """Running trials to stop now, each with the reason (`only`: look at these trials alone)."""
    if pruner == "none":
        return {}
    end = horizon(trials, max_step)
    running = [t for t in trials if not t.done and not t.stopped and t.points and (only is None or t.trial in only)]
    if pruner == "median":
        return median(trials, running, end=end, config=config)
    if end is None:
        return {}
    if pruner == "hyperband":
        return hyperband(trials, running, end=end, key=key, config=config)
    if pruner == "predicted":
        return predicted(trials, running, end=end, config=config)
    raise ValueError(f"unknown pruner {pruner!r}")


def _best_until(trial: Trial, step: float) -> float | None:
    return min((p.value for p in trial.points if p.step <= step), default=None)


def median(trials: list[Trial], running: list[Trial], *, end: float | None, config: Config) -> dict[int, str]:
    done = [t for t in trials if t.done and t.points]
    if len(done) < config.median_startup:
        return {}
    out = {}
    for trial in running:
        step = trial.points[-1].step
        if end is not None and step < config.median_warmup * end:
            continue
        others = [v for t in done if (v := _best_until(t, step)) is not None]
        if len(others) < config.median_startup:
            continue
        best, middle = final_value(trial), statistics.median(others)
        if best is not None and best > middle:
            out[trial.trial] = (
                f"median rule: best {best:.6g} by step {step:g} is worse than the median "
                f"{middle:.6g} of {len(others)} completed trials there"
            )
    return out


@dataclass
class _Brackets:
    """Optuna's bracket sizes and trial-to-bracket assignment (crc32 of `<study>_<number>`)."""

    n: int
    eta: int
    budgets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for index in range(self.n):
            s = self.n - 1 - index
            self.budgets.append(math.ceil(self.n * self.eta**s / (s + 1)))

    def of(self, key: str, trial: int) -> int:
        n = binascii.crc32(f"{key}_{trial}".encode()) % sum(self.budgets)
        for index, budget in enumerate(self.budgets):
            n -= budget
            if n < 0:
                return index
        return self.n - 1


def _promotable(value: float, competing: list[float], eta: int) -> bool:
    """Optuna's `_is_trial_promotable_to_next_rung` (minimise)."""
    index = max(0, len(competing) // eta - 1)
    return value <= sorted(competing)[index]


def hyperband(trials: list[Trial], running: list[Trial], *, end: float, key: str, config: Config) -> dict[int, str]:
    """Replay every trial's rungs in the order they were reached; a trial not promoted at a rung is stopped there."""
    eta, low = config.eta, end * config.hb_min_fraction
    brackets = _Brackets(n=int(math.floor(math.log(end / low, eta) + 1e-9)) + 1, eta=eta)
    events = []
    for trial in trials:
        bracket, rung = brackets.of(key, trial.trial), 0
        for point in trial.points:
            # rungs past the last are none (a tiny horizon and a huge step counted on until eta**k overflowed,
            # and every pass of the search failed; found by review)
            while rung <= brackets.n and point.step >= low * eta ** (bracket + rung):
                events.append((point.t, trial.trial, rung, bracket, point.value, point.step))
                rung += 1
    recorded: dict[tuple[int, int], list[float]] = {}
    stopped: dict[int, str] = {}
    for _, number, rung, bracket, value, step in sorted(events):
        if number in stopped:
            continue
        competing = recorded.setdefault((bracket, rung), [])
        competing.append(value)
        if not _promotable(value, competing, eta):
            stopped[number] = (
                f"hyperband: bracket {bracket}, rung {rung} (step {step:g}): {value:.6g} is not in "
                f"the best 1/{eta} of {len(competing)}"
            )
    return {t.trial: stopped[t.trial] for t in running if t.trial in stopped}


def predicted(trials: list[Trial], running: list[Trial], *, end: float, config: Config) -> dict[int, str]:
    """Stop a trial whose optimistic projected final value is worse than a value some other trial is sure of."""
    certain = {t.trial: v for t in trials if (t.done or not t.stopped) and (v := held_value(t)) is not None}
    projections = {}
    looked = {t.trial for t in running}
    for trial in trials:
        if trial.done or trial.stopped or not trial.points:
            continue
        if trial.trial not in looked and not config.use_projected:
            continue  # another running trial's projection is only needed as a rival
        progress = trial.points[-1].step / end
        if progress < config.min_progress:
            continue
        projections[trial.trial] = project(
            [p.step for p in trial.points], [p.value for p in trial.points], horizon=end, z=config.z, reach=config.reach
        )
    done = [t for t in trials if t.done and t.points]
    out = {}
    for trial in running:
        mine = projections.get(trial.trial)
        if mine is None:
            continue
        low = min(mine.low, trial.points[-1].value - config.history * _still_to_come(done, trial.points[-1].step))
        rivals = [v for n, v in certain.items() if n != trial.trial]
        if config.use_projected:
            rivals += [p.value for n, p in projections.items() if p is not None and n != trial.trial]
        if not rivals:
            continue
        bar = min(rivals)
        if low > bar + config.margin * abs(bar):
            out[trial.trial] = (
                f"predicted: final value projected {mine.value:.6g} (optimistic {low:.6g}) "
                f"cannot beat {bar:.6g}: at step {trial.points[-1].step:g} of {end:g}, "
                f"{len(trial.points)} points, {config.z:g} sigma, near-tie margin "
                f"{config.margin:.1%} (stops only above {bar + config.margin * abs(bar):.6g})"
            )
    return out


def _still_to_come(done: list[Trial], step: float) -> float:
    """The most a completed trial of this search improved after `step` (schedules that drop late show here)."""
    gains = [
        before - final
        for t in done
        if (before := _best_until(t, step)) is not None and (final := final_value(t)) is not None
    ]
    return max(gains, default=0.0)
