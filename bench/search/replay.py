"""Replay recorded learning curves through a search's pruners (the service's own code) as if the runs were the
trials of one search: trials start in order, `parallelism` at a time, each one's points arrive at its own pace,
and after every point the pruner decides; a stopped trial frees its slot at once."""

import heapq
from dataclasses import dataclass

from services.submitter.searches.pruners import Config, Point, Trial, decide


@dataclass(frozen=True)
class Curve:
    """One recorded run: its points (t seconds since start, step, value lower-is-better) and accelerators."""

    run: str
    points: tuple[Point, ...]
    gpus: float = 1.0

    @property
    def final(self) -> float:
        return min(p.value for p in self.points)

    @property
    def wall_s(self) -> float:
        return self.points[-1].t


@dataclass(frozen=True)
class Outcome:
    gpu_s: float
    full_gpu_s: float
    best_stopped: bool
    regret: float  # found best minus true best (0 when the true best completed)
    pruned: int


def simulate(
    curves: list[Curve], pruner: str, *, parallelism: int = 4, config: Config = Config(), key: str = "replay"
) -> Outcome:
    """Run the group as one search and account GPU-seconds spent."""
    n = len(curves)
    start: dict[int, float] = {}
    seen: dict[int, int] = {}
    ended: dict[int, tuple[float, bool]] = {}  # trial -> (end time, pruned)
    queue: list[tuple[float, int, int]] = []  # (arrival time, trial, point index)
    following = 0

    shifted: dict[int, list[Point]] = {}  # each started trial's points on the search's clock

    def launch(now: float) -> None:
        nonlocal following
        while following < n and sum(1 for k in start if k not in ended) < parallelism:
            start[following], seen[following] = now, 0
            shifted[following] = [Point(now + p.t, p.step, p.value) for p in curves[following].points]
            heapq.heappush(queue, (now + curves[following].points[0].t, following, 0))
            following += 1

    def state(now: float) -> list[Trial]:
        return [
            Trial(
                trial=k,
                points=tuple(shifted[k][: seen[k]]),
                done=k in ended and not ended[k][1],
                stopped=k in ended and ended[k][1],
            )
            for k in start
        ]

    launch(0.0)
    while queue:
        now, k, index = heapq.heappop(queue)
        if k in ended:
            continue
        seen[k] = index + 1
        curve = curves[k]
        if index + 1 == len(curve.points):
            ended[k] = (now, False)
        else:
            heapq.heappush(queue, (start[k] + curve.points[index + 1].t, k, index + 1))
            if decide(pruner, state(now), key=key, config=config, only={k}):
                ended[k] = (now, True)
        launch(now)
    gpu_s = sum((ended[k][0] - start[k]) * curves[k].gpus for k in ended)
    full = sum(c.wall_s * c.gpus for c in curves)
    true_best = min(range(n), key=lambda k: curves[k].final)
    found = min(curves[k].final for k in ended if not ended[k][1])
    return Outcome(
        gpu_s=gpu_s,
        full_gpu_s=full,
        best_stopped=ended[true_best][1],
        regret=found - curves[true_best].final,
        pruned=sum(1 for e in ended.values() if e[1]),
    )
