"""A job's time to its end from the progress it prints (pure): the reader's progress fed to a rate-only online
estimator, rebuilt when the unit or the total changes (its marks counted in another unit mean nothing to it)."""

from dataclasses import dataclass, field

from services.estimator.model.online import Estimate, OnlineEstimator
from services.estimator.model.progress import MAX_TOTAL, Progress, ProgressReader

# A declared amount of work's parameter names the unit it counts in: a printed count without its total (Lightning's
# epochs, DeepSpeed's `step=`) is measured against it.
DECLARED_UNITS = {
    "max_steps": "step",
    "total_steps": "step",
    "num_steps": "step",
    "epochs": "epoch",
    "num_epochs": "epoch",
    "max_epochs": "epoch",
}
SAME_UNIT = {"it": "step", "step": "step", "epoch": "epoch"}


@dataclass
class PrintedWork:
    """What the job's output says of its progress, and the time to its end that follows."""

    start: float
    declared: tuple[str, float] | None = None  # (unit, total) a spec parameter declares
    reader: ProgressReader = field(default_factory=ProgressReader)
    progress: Progress | None = None
    key: tuple[str, float] | None = None  # (unit, total) the estimator counts in
    online: OnlineEstimator | None = None

    def observe(self, line: str, t: float) -> bool:
        """Feed one output line; whether it carried progress."""
        progress = self.reader.observe(line, t)
        if not self.reader.carried or progress is None:
            return self.reader.carried
        total = progress.total
        if total is None and self.declared and SAME_UNIT.get(progress.unit) == self.declared[0]:
            total = self.declared[1]
        if total is None or not 0 < total <= MAX_TOTAL or progress.done > total:
            self.progress = progress
            return True
        self.progress = Progress(progress.done, total, progress.unit, progress.source, progress.rate)
        key = (progress.unit, total)
        if key != self.key or self.online is None:  # marks in another unit or of another total mean nothing here
            self.key = key
            self.online = OnlineEstimator(start_time=self.start, total_work=total, count_stall=True)
        self.online.observe(t, progress=progress.done)  # it keeps only marks that move forward, thinned
        return True

    def estimate(self, now: float) -> Estimate | None:
        """Time to the job's end at its printed rate; None until a rate and a total are known."""
        if self.online is None:
            return None
        e = self.online.estimate(now)
        return e if e.method != "none" else None

    def rate(self) -> float | None:
        live = self.online.rate() if self.online is not None else None
        return live[0] if live is not None else (self.progress.rate if self.progress else None)
