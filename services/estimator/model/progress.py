"""Progress from what jobs already print (pure): tqdm bars, Hugging Face Trainer, PyTorch Lightning, Keras,
torchrun/DeepSpeed step logs and `step N/M` lines, read without any declaration.

`read_line` turns one line into readings; `ProgressReader` keeps what a job's lines said (bars by name, the epoch
it is in) and gives its progress: done and total in the unit it counts in, the rate and which format said so.
Every number is a claim of the job's: a total past MAX_TOTAL, a count past its total, a bar whose total changes
each time it prints are ignored."""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.safe_regex import clip

MAX_TOTAL = 1e12  # no job counts past a trillion steps, epochs or batches: a bigger total is noise or hostile
MAX_BARS = 16  # bars kept per job (a job naming a new bar on every line grows no further)
MAX_DESC = 48  # characters of a bar's description that name it

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x08\x00-\x07\x0b-\x1f]")
SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
NUMBER = r"\d{1,16}(?:\.\d{1,6})?[kMGT]?"
# tqdm: `desc: 37%|███▋      | 370/1000 [00:12<00:20, 30.1it/s, loss=1.2]`, read from each `%|` a line holds
# (`tqdm_bar`): what follows it by this pattern, anchored there; what precedes it (the percentage, the description)
# by walking back. The one pattern `desc\s*\d{1,3}%|...` searched from every position of a line tried every
# description length at every start: a line of 4,000 spaces took 15 s of the estimator's CPU (found by review).
TQDM_TAIL = re.compile(rf"\|[^|]{{0,120}}\|\s*(?P<n>{NUMBER})/(?P<total>{NUMBER})\s*\[(?P<info>[^\]]{{0,200}})\]")
MAX_BAR_MARKS = 8  # `%|` looked at in one line: a bar prints one
TQDM_RATE = re.compile(
    rf"(?:(?P<rate>{NUMBER})\s?(?P<unit>[A-Za-z_]{{0,16}})/s|"
    rf"(?P<inv>{NUMBER})\s?s/(?P<inv_unit>[A-Za-z_]{{0,16}}))"
)
# rich (Lightning's RichProgressBar): `Epoch 2/9  ━━━━━━━━━━━━ 20/20 0:00:03 • 6.3it/s loss: 0.77`
RICH = re.compile(
    rf"^(?P<desc>[^━]{{0,{MAX_DESC * 2}}}?)\s*━{{1,200}}\s+(?P<n>\d{{1,13}})/(?P<total>\d{{1,13}})\s"
    rf"[^•]{{0,40}}•\s*(?P<rate>{NUMBER})(?P<unit>[A-Za-z_]{{0,16}})/s"
)
# Keras: `125/1875 [==>...........] - ETA: 1:02 - loss: 0.3` (2) or `125/1875 ━━━━━━━━━━ 3s 2ms/step` (3)
KERAS = re.compile(
    r"^\s*(?P<n>\d{1,13})/(?P<total>\d{1,13})\s+(?:\[[=>.]{1,200}\]|━{1,200})"
    r"(?:.{0,40}?(?P<per>\d{1,9})(?P<per_unit>ms|s|us)/step)?"
)
# whitespace bounded: two unbounded runs around an optional sign cost the square of a long run of spaces
EPOCH = re.compile(
    r"\bepoch\s{0,32}[:\[]?\s{0,32}(?P<n>\d{1,9})\s{0,32}(?:/|of)\s{0,32}(?P<total>\d{1,9})\b", re.IGNORECASE
)
# `step 120/1000`, `Step [120/1000]`, `iteration 120 of 1000`, Megatron's `iteration      120/  500000 |`
STEPS = re.compile(
    r"\b(?:global[_ ]?)?(?:step|iteration|iter)s?\s{0,32}[:=#\[]?\s{0,32}(?P<n>\d{1,13})\s{0,32}(?:/|of)\s{0,32}"
    r"(?P<total>\d{1,13})\b",
    re.IGNORECASE,
)
# DeepSpeed's `[Rank 0] step=120, skipped=0, lr=[...]` and `global_step=120`: a count without its total
STEP_COUNT = re.compile(r"(?:^|[\s,\[(])(?:global_)?step\s?[=:]\s?(?P<n>\d{1,13})\b")
# Hugging Face Trainer's log dicts: `{'loss': 0.69, 'grad_norm': 1.2, 'learning_rate': 4e-05, 'epoch': 0.5}`
HF_LOG = re.compile(r"^\{'[a-z_]{1,40}': .{0,400}'epoch': '?(?P<epoch>\d{1,9}(?:\.\d{1,6})?)")
ASIDE = re.compile(r"valid|sanity|test|predict|eval", re.IGNORECASE)
EPOCH_DESC = re.compile(r"\bepoch\s*(?P<n>\d{1,9})(?:\s*/\s*(?P<last>\d{1,9}))?", re.IGNORECASE)


@dataclass(frozen=True)
class Reading:
    """What one line says: a bar (`n` of `total`), an epoch (`n` of `total`, 1-based) or a step count."""

    kind: str  # "bar", "epoch", "steps", "epoch-fraction" (Hugging Face's log dicts: only the source is read)
    n: float
    total: float | None
    source: str  # tqdm, keras, lightning, hf-trainer, steps
    name: str = ""  # the bar's description, digits dropped: which bar it is
    unit: str = "it"
    rate: float | None = None  # units per second, as the line prints it
    epoch: tuple[int, int | None] | None = None  # (0-based epoch, last epoch) a bar's description names


@dataclass(frozen=True)
class Progress:
    """A job's progress as its output shows it."""

    done: float
    total: float | None
    unit: str
    source: str
    rate: float | None = None


def scaled(text: str) -> float | None:
    """`1.2k` -> 1200.0; None past MAX_TOTAL."""
    suffix = text[-1] if text[-1] in SCALE else ""
    value = float(text[: len(text) - len(suffix)]) * SCALE[suffix]
    return value if value <= MAX_TOTAL else None


def latest(line: str) -> str:
    """The text a terminal would show: the last carriage-return segment that holds anything, without escapes."""
    parts = [p for p in line.split("\r") if p.strip()]
    return ANSI.sub("", clip(parts[-1][-4096:])) if parts else ""


def read_line(line: str) -> list[Reading]:
    """Every progress reading one output line carries (none for a line that carries none)."""
    text = latest(line)
    if not text or not any(c.isdigit() for c in text):
        return []
    readings = []
    if (m := HF_LOG.search(text)) is not None:
        return [Reading("epoch-fraction", float(m["epoch"]), None, "hf-trainer")]
    if (bar := tqdm_bar(text)) is not None:
        readings += _tqdm(bar)
    elif (m := RICH.search(text)) is not None:
        readings += _bar(m.groupdict(), source="lightning", rate=_number(m["rate"]), unit=m["unit"] or "it")
    elif (m := KERAS.search(text)) is not None:
        per = {"ms": 1e-3, "s": 1.0, "us": 1e-6}.get(m["per_unit"] or "")
        rate = 1 / (int(m["per"]) * per) if per and int(m["per"]) > 0 else None
        readings += _bar(m.groupdict(), source="keras", rate=rate, unit="step")
    elif (m := EPOCH.search(text)) is not None:
        source = "keras" if text.startswith("Epoch") else "steps"
        readings.append(Reading("epoch", int(m["n"]), int(m["total"]), source, unit="epoch"))
    elif (m := STEPS.search(text)) is not None:
        readings.append(Reading("steps", int(m["n"]), int(m["total"]), "steps", unit="step"))
    elif (m := STEP_COUNT.search(text)) is not None:
        readings.append(Reading("steps", int(m["n"]), None, "steps", unit="step"))
    return [
        r
        for r in readings
        if (r.total is None or 0 <= r.n <= r.total <= MAX_TOTAL and r.total > 0) and (r.kind != "epoch" or r.n >= 1)
    ]  # `Epoch 3/10` counts from 1


def tqdm_bar(text: str) -> dict[str, str] | None:
    """The line's first tqdm bar (description, count, total, the bracket's info), as the one pattern this replaced
    read it searched from the left (the description: up to 96 characters before the percentage and its spaces, no
    `|` or `%`; `tests/unit/test_progress_linear.py` holds them equal), in time linear in the line's length; a
    line's first MAX_BAR_MARKS `%|` are looked at."""
    start = 0
    for _ in range(MAX_BAR_MARKS):
        mark = text.find("%|", start)
        if mark < 0:
            return None
        start = mark + 1
        digits = mark
        while digits > max(mark - 3, 0) and text[digits - 1].isdecimal():
            digits -= 1
        if digits == mark or (tail := TQDM_TAIL.match(text, mark + 1)) is None:
            continue
        end = digits
        while end > 0 and text[end - 1].isspace():
            end -= 1
        begin = end
        while begin > max(end - MAX_DESC * 2, 0) and text[begin - 1] not in "|%":
            begin -= 1
        return {"desc": text[begin:end], "n": tail["n"], "total": tail["total"], "info": tail["info"]}
    return None


def _number(text: str | None) -> float | None:
    return scaled(text) if text else None


def _tqdm(m: dict[str, str]) -> list[Reading]:
    rate = TQDM_RATE.search(m["info"])
    unit, per_s = "it", None
    if rate is not None and rate["rate"]:
        per_s, unit = _number(rate["rate"]), rate["unit"] or "it"
    elif rate is not None and (inverse := _number(rate["inv"])):
        per_s, unit = 1 / inverse, rate["inv_unit"] or "it"
    source = "lightning" if "v_num" in m["info"] else "tqdm"
    return _bar(m, source=source, rate=per_s, unit=unit)


def _bar(m: Mapping[str, str | None], *, source: str, rate: float | None, unit: str) -> list[Reading]:
    n, total = _number(m["n"]), _number(m["total"])
    if n is None or total is None:
        return []
    desc = m.get("desc") or ""
    epoch = None
    if (e := EPOCH_DESC.search(desc)) is not None:  # Lightning's `Epoch 3` (0-based; rich adds `/9`, the last)
        epoch = (int(e["n"]), int(e["last"]) if e["last"] else None)
        source = "lightning"
    name = re.sub(r"\d+", "#", desc.strip())[-MAX_DESC:]
    return [Reading("bar", n, total, source, name=name, unit=unit[:16], rate=rate, epoch=epoch)]


@dataclass
class Bar:
    """One bar as the job printed it so far."""

    n: float
    total: float
    first: float  # when first seen (order: an outer bar is made before the one inside it)
    last: float
    unit: str
    source: str
    rate: float | None
    sightings: int = 1
    increments: int = 0  # times its count went up
    resets: int = 0  # times its count went back (an inner bar starting its next round)


@dataclass
class ProgressReader:
    """A job's progress from its output lines; feed `observe` each line."""

    bars: dict[tuple[str, float], Bar] = field(default_factory=dict)
    epoch: tuple[int, int] | None = None  # (epochs begun, epochs to run) from `Epoch 3/10` lines
    epoch_total_seen: int | None = None
    epoch_source: str = "steps"
    flavour: str | None = None  # hf-trainer once its log dicts are seen
    bar_epoch: int | None = None  # Lightning's `Epoch 3` (0-based) on its bar
    steps: Progress | None = None
    last: Progress | None = None
    carried: bool = False  # the last line fed carried progress (worth keeping to replay)

    def observe(self, line: str, t: float) -> Progress | None:
        """Feed one line; the job's progress as known after it (None while nothing is known)."""
        readings = read_line(line)
        self.carried = bool(readings)
        if not readings:
            return self.last
        for reading in readings:
            if reading.kind == "epoch-fraction":
                self.flavour = "hf-trainer"
            elif reading.kind == "epoch":
                if reading.total is not None:  # read_line gives every epoch its total
                    self._epoch(int(reading.n), int(reading.total), reading.source)
            elif reading.kind == "steps":
                self.steps = Progress(reading.n, reading.total, "step", "steps")
            elif reading.total is not None:  # a bar without a total says nothing of the work left
                self._bar(reading, reading.total, t)
        now = self.progress()
        if now is not None and self.last is not None and (now.unit, now.total) == (self.last.unit, self.last.total):
            # a bar drawn at 0 again before its next round is named (Lightning's): the work done stays done
            now = now if now.done >= self.last.done else self.last
        self.last = now or self.last
        return self.last

    def _epoch(self, n: int, total: int, source: str) -> None:
        if self.epoch is not None and n != self.epoch[0]:
            for bar in self.bars.values():  # the epoch's bar starts its next round (Keras prints the line first)
                bar.resets += bar.n > 0
                bar.n = 0
        # A total that changes is no total: believed again once two lines agree.
        self.epoch = (n, total) if self.epoch_total_seen in (None, total) else None
        self.epoch_total_seen, self.epoch_source = total, source

    def _bar(self, r: Reading, total: float, t: float) -> None:
        key = (r.name, total)
        bar = self.bars.get(key)
        if bar is None:
            if len(self.bars) >= MAX_BARS:
                del self.bars[min(self.bars, key=lambda k: self.bars[k].last)]
            self.bars[key] = Bar(r.n, total, t, t, r.unit, r.source, r.rate)
        else:
            bar.sightings += 1
            bar.increments += r.n > bar.n
            bar.resets += r.n < bar.n
            bar.n, bar.last, bar.rate = r.n, t, r.rate
        if r.epoch is not None:
            first, last = r.epoch
            self.epoch = (first + 1, last + 1) if last is not None else self.epoch
            self.bars[key].source = "lightning"
            self.bar_epoch = first

    def progress(self) -> Progress | None:
        """The outermost bar that moves, an inner bar's share of its round added; epochs x steps per epoch."""
        bars = self._shown()
        if not bars:
            return self._lines()
        # A bar that starts over is inside another (or an evaluation's), a finished one moves no more: the oldest
        # bar still moving that never started over; when every bar starts over (one per epoch, an evaluation's
        # between), the one that moved most; when none moves, the last one drawn.
        pool = [(k, b) for k, b in bars if b.resets == 0]
        live = [(k, b) for k, b in pool or bars if b.n < b.total]
        if live:
            outer_key, outer = live[0] if pool else max(live, key=lambda kb: kb[1].increments)
        else:
            outer_key, outer = max(pool or bars, key=lambda kb: kb[1].last)
        # The bar inside it: of those making rounds, the one that moved most (an evaluation's moves less)
        inner = max(
            (b for k, b in self._shown() if k != outer_key and _nested(b, outer)),
            key=lambda b: b.increments,
            default=None,
        )
        source = self.flavour or outer.source
        if inner is not None:  # nested bars: counted in the inner bar's unit
            # an inner bar drawn before the outer one moved on: its count is of a round the outer one counts
            done = outer.n * inner.total + (inner.n if inner.last > outer.last else 0)
            return Progress(done, outer.total * inner.total, inner.unit, source, inner.rate)
        if self.epoch is not None and (outer.resets > 0 or outer.source in ("keras", "lightning")):
            # a bar per epoch (Keras, Lightning): the epochs before this one, full, and this one's count
            begun, epochs = self.epoch
            return Progress((begun - 1) * outer.total + outer.n, epochs * outer.total, outer.unit, source, outer.rate)
        if (waiting := self._waiting(outer)) is not None:  # an outer bar drawn at 0 once, its first round
            return Progress(outer.n, waiting.total * outer.total, outer.unit, source, outer.rate)
        if self.bar_epoch is not None:  # Lightning's bar without the epochs to run: epochs done so far
            return Progress(self.bar_epoch + outer.n / outer.total, None, "epoch", source)
        return Progress(outer.n, outer.total, outer.unit, source, outer.rate)

    def _shown(self) -> list[tuple[tuple[str, float], Bar]]:
        """Bars drawn twice (a total that changes is a new bar each time) and not an evaluation's, oldest first."""
        return sorted(
            ((k, b) for k, b in self.bars.items() if b.sightings >= 2 and not ASIDE.search(k[0])),
            key=lambda kb: kb[1].first,
        )

    def _waiting(self, bar: Bar) -> Bar | None:
        """The bar drawn once, at 0, just before `bar` started its first round: nested tqdm's outer bar, drawn
        again only when that round ends."""
        if bar.resets:
            return None
        return next(
            (
                b
                for k, b in self.bars.items()
                if b.sightings == 1
                and b.n == 0
                and b.first <= bar.first
                and b is not bar
                and not ASIDE.search(k[0])
                and b.total * bar.total <= MAX_TOTAL
                and bar.first - b.first <= bar.last - bar.first
            ),
            None,
        )

    def _lines(self) -> Progress | None:
        if self.steps is not None:
            return self.steps
        if self.epoch is not None:
            return Progress(self.epoch[0] - 1, self.epoch[1], "epoch", self.epoch_source)
        return None


def _nested(inner: Bar, outer: Bar) -> bool:
    """An inner bar makes its rounds while the outer one moves at most once a round (nested tqdm); an evaluation
    bar between training steps does not (the training bar moved many times between its rounds)."""
    return (
        inner.first >= outer.first
        and outer.increments <= inner.resets + 1
        and inner.resets + inner.n > 0
        and outer.total < MAX_TOTAL / max(inner.total, 1)
    )
