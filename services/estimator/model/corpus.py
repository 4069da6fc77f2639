"""Load MLPerf Training result tarballs into `Run` records (the only I/O in this package)."""

from __future__ import annotations

import hashlib
import math
import pickle
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from services.estimator.model.mllog import MARK_KEYS, LogRecord, mark_progress, parse_json, parse_mllog_line
from services.estimator.model.targets import TARGETS, Target, metric_scalar, reached

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "mlperf"

_RESULT_PATH = re.compile(r"(?:^|/)([^/]+)/results/([^/]+)/([^/]+)/result_(\d+)\.txt$")
_SYSTEM_PATH = re.compile(r"(?:^|/)([^/]+)/systems/([^/]+)\.json$")
_VERSION = re.compile(r"v(\d+\.\d+)")
# Only these keys are decoded; the rest of a log is skipped for speed.
_KEYS = (
    "run_start",
    "run_stop",
    "global_batch_size",
    "opt_base_learning_rate",
    "lars_opt_base_learning_rate",
    *sorted(MARK_KEYS),
)
_KEY_PATTERN = re.compile(r'"key": "(' + "|".join(_KEYS) + r')"')


@dataclass(frozen=True)
class Observation:
    """What a log says at `t_s` seconds after run_start: progress and/or metric value."""

    t_s: float
    progress: float | None = None
    value: float | None = None


@dataclass
class Run:
    """One MLPerf training run with its hardware, hyper-parameters and timeline."""

    run_id: str
    version: str
    submitter: str
    system: str
    benchmark: str
    accelerator: str = "unknown"
    accelerators_per_node: int = 0
    nodes: int = 1
    batch_size: float = 0.0
    learning_rate: float = 0.0
    run_start_ms: int = 0
    run_stop_ms: int = 0
    status: str = "unknown"
    observations: list[Observation] = field(default_factory=list)
    # A target declared for a benchmark the built-in table does not know (`--targets FILE`, a job's spec).
    target_value: float | None = None
    target_mode: str | None = None

    @property
    def accelerators(self) -> int:
        return max(1, self.accelerators_per_node * self.nodes)

    @property
    def duration_s(self) -> float:
        return (self.run_stop_ms - self.run_start_ms) / 1000.0

    @property
    def target(self) -> float | None:
        known = TARGETS.get(self.benchmark)
        return known.value if known else self.target_value

    @property
    def mode(self) -> str:
        known = TARGETS.get(self.benchmark)
        return known.mode if known else (self.target_mode or "max")

    @property
    def succeeded(self) -> bool:
        """The log itself says the run met its target (MLPerf's run_stop status)."""
        return self.status == "success" and self.duration_s > 0

    @property
    def evals(self) -> list[Observation]:
        return [o for o in self.observations if o.value is not None]

    @property
    def total_work(self) -> float | None:
        """Progress (samples or epochs as the log counts them) when the target was met."""
        if self.target is None:
            return None
        for o in self.observations:
            if o.value is not None and o.progress is not None and reached(o.value, self.target, self.mode):
                return o.progress
        marks = [o.progress for o in self.observations if o.progress is not None]
        return max(marks) if marks else None

    def reached_target(self) -> bool:
        if self.target is None:
            return False
        return any(o.value is not None and reached(o.value, self.target, self.mode) for o in self.evals)


def default_tarballs() -> list[Path]:
    """The tarballs under the default data folder (`../shared/data/mlperf` of the repo)."""
    return sorted(DEFAULT_DATA_DIR.glob("*.tar.gz"))


def load_corpus(path: str | Path, *, usable_only: bool = True, targets: dict[str, Target] | None = None) -> list[Run]:
    """Read every result file of one tarball; keep successful runs with timings if asked.

    Benchmarks of the built-in table are read with it; others with `targets` (declared), or,
    when not usable_only, without a target (they cannot be scored, but they are counted)."""
    targets = targets or {}
    path = Path(path)
    named = _VERSION.search(path.name)
    version = named.group(1) if named else path.stem
    runs, systems = [], {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            sys_match = _SYSTEM_PATH.search(member.name)
            res_match = _RESULT_PATH.search(member.name)
            if sys_match is None and res_match is None:
                continue
            file = tar.extractfile(member)
            if file is None:
                continue
            data = file.read().decode("utf-8", "replace")
            if sys_match:
                systems[(sys_match.group(1), sys_match.group(2))] = _safe_json(data)
            elif res_match is not None:
                org, system, bench, idx = res_match.groups()
                declared = None if bench in TARGETS else targets.get(bench)
                if bench in TARGETS or declared is not None or not usable_only:
                    run_id = f"v{version}/{org}/{system}/{bench}/{idx}"
                    runs.append(
                        parse_run(
                            data,
                            run_id=run_id,
                            version=version,
                            org=org,
                            system=system,
                            benchmark=bench,
                            declared=declared,
                        )
                    )
    for run in runs:
        _apply_system(run, systems.get((run.run_id.split("/")[1], run.system), {}))
    if usable_only:
        runs = [r for r in runs if is_usable(r)]
    return runs


def load_corpora(paths: Iterable[str | Path], *, targets: dict[str, Target] | None = None) -> list[Run]:
    """`load_corpus` over several tarballs."""
    return [run for path in paths for run in load_corpus(path, targets=targets)]


def load_cached(
    path: str | Path, *, targets: dict[str, Target] | None = None, cache_dir: Path | None = None
) -> list[Run]:
    """Every run of a tarball (usable or not), parsed once: later calls read a pickle keyed by the
    tarball's identity, the declared targets and this parser's code."""
    path = Path(path)
    if cache_dir is None:
        return load_corpus(path, usable_only=False, targets=targets)
    here = Path(__file__).parent
    key = hashlib.sha256(
        repr(
            (str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns, sorted((targets or {}).items()))
        ).encode()
    )
    for name in ("corpus.py", "mllog.py", "targets.py"):
        key.update((here / name).read_bytes())
    cached = Path(cache_dir) / f"{path.stem}-{key.hexdigest()[:16]}.pkl"
    if cached.exists():
        with cached.open("rb") as fh:
            return pickle.load(fh)  # our own file, written below from the same code
    runs = load_corpus(path, usable_only=False, targets=targets)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        pickle.dump(runs, fh)
    tmp.replace(cached)
    return runs


# More nodes or accelerators per node than any system has: an odd file's field, skipped.
MAX_COUNT = 1_000_000
# A few logs stop seconds after run_start (smoke tests); they are not training runs.
MIN_DURATION_S = 30.0


def is_usable(run: Run) -> bool:
    """Successful, timed runs whose logged metric reached the target."""
    return (
        run.status == "success"
        and run.duration_s >= MIN_DURATION_S
        and run.total_work is not None
        and run.reached_target()
    )


def parse_run(
    text: str, *, run_id: str, version: str, org: str, system: str, benchmark: str, declared: Target | None = None
) -> Run:
    """Build a `Run` from the text of one result file (`declared`: target of a benchmark not in TARGETS)."""
    # The folder names the organisation; many logs say SUBMISSION_ORG_PLACEHOLDER.
    run = Run(
        run_id=run_id,
        version=version,
        submitter=org,
        system=system,
        benchmark=benchmark,
        target_value=declared.value if declared else None,
        target_mode=declared.mode if declared else None,
    )
    metric = declared.metric if declared else "eval_accuracy"
    records = []
    for line in text.splitlines():
        if _KEY_PATTERN.search(line) is None and f'"{metric}"' not in line:
            continue
        rec = parse_mllog_line(line)
        if rec is not None:
            records.append(rec)
    for rec in records:
        if rec.key == "run_start" and not run.run_start_ms:
            run.run_start_ms = rec.time_ms
        elif rec.key == "run_stop":
            run.run_stop_ms = rec.time_ms
            run.status = str(rec.metadata.get("status", "unknown"))
        elif rec.key == "global_batch_size":
            run.batch_size = _num(rec.value)
        elif rec.key in ("opt_base_learning_rate", "lars_opt_base_learning_rate"):
            run.learning_rate = _num(rec.value)
    run.observations = _timeline(records, run, metric)
    return run


def _timeline(records: Iterable[LogRecord], run: Run, metric: str = "eval_accuracy") -> list[Observation]:
    start, stop = run.run_start_ms, run.run_stop_ms or float("inf")
    merged: dict[tuple[float, float | None], list] = {}
    obs = []
    for rec in records:
        if (rec.key not in MARK_KEYS and rec.key != metric) or rec.time_ms < start:
            continue
        progress = mark_progress(rec, run.benchmark, run.batch_size)
        if rec.key == metric and rec.key not in MARK_KEYS:
            progress = rec.progress()
        if rec.key != metric:
            if progress is not None and rec.time_ms <= stop:
                obs.append(Observation(t_s=(rec.time_ms - start) / 1000.0, progress=progress))
            continue
        value = metric_scalar(run.benchmark, rec.value, rec.metadata)
        if value is not None:
            # Offline evaluations (stable_diffusion) are stamped after run_stop: place them
            # at the moment the run stopped, the earliest time their result is known.
            t_ms = min(rec.time_ms, stop)
            merged.setdefault((t_ms if progress is None else -1.0, progress), []).append((t_ms, value))
    mode = run.mode
    for (_, progress), items in merged.items():
        worst = min(v for _, v in items) if mode == "max" else max(v for _, v in items)
        t_ms = max(t for t, _ in items)
        obs.append(Observation(t_s=(t_ms - start) / 1000.0, progress=progress, value=worst))
    obs.sort(key=lambda o: (o.t_s, o.value is not None))
    return _monotone_progress(obs)


def _monotone_progress(obs: list[Observation]) -> list[Observation]:
    """Keep eval progress that grows; keep other marks only between the evals around them."""
    evals = [o.progress for o in obs if o.value is not None and o.progress is not None]
    ceiling = max(evals) if evals else float("inf")
    out, best = [], float("-inf")
    for o in obs:
        kept: Observation | None = o
        if o.progress is not None:
            bad = o.progress < best or (o.value is None and o.progress > ceiling)
            if bad:
                kept = Observation(t_s=o.t_s, value=o.value) if o.value is not None else None
            elif o.value is not None:
                best = o.progress
        if kept is not None:
            out.append(kept)
    return out


def _apply_system(run: Run, desc: dict) -> None:
    run.accelerator = str(desc.get("accelerator_model_name") or "unknown").strip() or "unknown"
    run.accelerators_per_node = _count(desc.get("accelerators_per_node"), 0)
    run.nodes = max(1, _count(desc.get("number_of_nodes"), 1))


def _num(value: object, default: float = 0.0) -> float:
    """The number a field holds, or `default` for anything else: a list, null, text, infinity, NaN, or an integer
    too large for a float (a hostile or odd file must not stop the corpus build)."""
    if not isinstance(value, str | int | float):  # a list, an object or null where a number belongs
        return default
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if math.isfinite(number) else default


def _count(value: object, default: int) -> int:
    """A whole count of a system description (nodes, accelerators per node), or `default` past MAX_COUNT."""
    number = _num(value, default)
    return int(number) if 0 <= number <= MAX_COUNT else default


def _safe_json(text: str) -> dict:
    """A system description as a dict, numbers cleaned; {} when it is no JSON object (too deep, invalid)."""
    obj = parse_json(text)
    return obj if isinstance(obj, dict) else {}
