"""The wait a placement causes: jobs that may only run on owned capacity and queue behind a job that could rent.

A free owned GPU costs a job that could rent nothing at the exchange rate, so without this such a job takes the last
free local GPUs and the jobs that can run nowhere else wait behind it. Here a job that may rent is charged, for an
owned option, the time it adds to that backlog at the backlog's own exchange rates. Holding g GPUs for d seconds on a
kind of N GPUs takes g * min(d, t) GPU-seconds of the kind's capacity away before a backlog job that starts t
seconds from now, so it delays that job by about g * min(d, t) / N: a job that starts after the GPUs come back is
delayed by the whole g * d / N, one that starts sooner only by what the kind lost until then; the next jobs in line
that would have started now on the g free GPUs taken are delayed by their whole wait up to d (`head_dollars`, the rule
make room credits for freeing GPUs: one rule for taking and freeing). When each backlog job
starts is planned on the kind's free GPUs (less the g taken), the expected ends of the jobs running on it and the
backlog's own durations, in the order the queue serves it (`order.backlog_order`: time-sensitive first, then
submission; with `PolicyConfig.owned_wait_order`, the queue's own order) (pure; one `Backlog` per pass).

A "kind" here is one queue of owned GPUs (`queue_keys`): one per owned kind, and per kind and model for the jobs that
accept only some models; with `PolicyConfig.one_owned_queue`, one per job's whole set of owned kinds and models (it
waits for the first GPU back among all of them). A placement is charged by every queue its GPU is in.
"""

import bisect
import heapq
import itertools
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from services.placement.policy.capacity import expected_end
from services.placement.policy.choice import Option
from services.placement.policy.config import PolicyConfig
from services.placement.policy.models import OWNED_KINDS, ClusterState, JobRequest
from services.placement.policy.order import backlog_order

INF = float("inf")
QueueKey = tuple[tuple[str, ...], tuple[str, ...]]  # (owned kinds, GPU models: none is any)


@dataclass(slots=True)
class Waits:
    """Jobs' waits (seconds from now), what their time is worth ($ per s) and their queue order, with prefix sums:
    `relief(cut)` is the dollars of waiting taken off (or put on) them when each is delayed by `cut` seconds but never
    more than its wait."""

    waits: list[tuple[float, float, tuple]] = field(default_factory=list)  # (wait s, $ per s, queue order)
    _at: list[float] = field(default_factory=list)
    _value: list[float] = field(default_factory=list)  # prefix sums of $ per s
    _weighted: list[float] = field(default_factory=list)  # prefix sums of $ per s * wait (finite waits)
    _queue: list[int] = field(default_factory=list)  # indices of `waits` in queue order

    def index(self) -> None:
        self.waits.sort()
        self._at = [w for w, _, _ in self.waits]
        self._value = [0.0, *itertools.accumulate(v for _, v, _ in self.waits)]
        self._weighted = [0.0, *itertools.accumulate(v * w if w < INF else 0.0 for w, v, _ in self.waits)]
        self._queue = sorted(range(len(self.waits)), key=lambda i: self.waits[i][2])

    def relief(self, cut: float) -> float:
        """Sum over the jobs of $ per s * min(wait, cut)."""
        i = bisect.bisect_left(self._at, cut)
        return self._weighted[i] + cut * (self._value[-1] - self._value[i])

    def head(self, count: int) -> list[int]:
        """The next `count` jobs in line: in queue order (the engine's), among those that still wait."""
        return list(itertools.islice((i for i in self._queue if self.waits[i][0] > 0), count))

    def shorten(self, share: float, cut: float, *, started: Collection[int] = ()) -> None:
        """Each wait less share * min(wait, cut): the delay `delay_dollars(waits, ...)` prices at share * relief(cut),
        taken off (freed GPUs); the jobs `started` (indices) start on them now: they wait no more this pass."""
        self.waits = [
            (0.0 if i in started else max(0.0, w - share * min(cut, w)), v, order)
            for i, (w, v, order) in enumerate(self.waits)
        ]
        self.index()


@dataclass(slots=True)
class Kind:
    """One owned kind: its GPUs, GPUs free now, when its busy GPUs are expected back, and its owned-only backlog."""

    gpus: int = 0
    free: int = 0
    ends: dict[float, int] = field(default_factory=dict)  # expected release time -> busy GPUs released then
    _times: list[float] = field(default_factory=list)  # the keys of `ends`, sorted
    busy: int = 0  # GPUs in `ends`
    # job id -> (queue order, GPUs, $ per s, duration s)
    queued: dict[str, tuple[tuple, int, float, float]] = field(default_factory=dict)
    _waits: dict[int, "Plan"] = field(default_factory=dict)
    _in_order: list[tuple[tuple, int, float, float]] | None = None  # `queued` sorted, until it changes
    _totals: tuple[int, float] | None = None  # (demand, value) of `queued`, until it changes
    _after: list[float] = field(default_factory=list)  # suffix sums of $ per s along `_in_order`
    _gpus: list[int] = field(default_factory=list)  # prefix sums of GPUs along `_in_order`
    _values: list[float] = field(default_factory=list)  # prefix sums of $ per s along `_in_order`

    @property
    def demand(self) -> int:
        """GPUs the backlog asks for."""
        return self._sums()[0]

    @property
    def value(self) -> float:
        """What the backlog's time is worth ($ per s)."""
        return self._sums()[1]

    def _sums(self) -> tuple[int, float]:
        if self._totals is None:
            queued = self.queued.values()
            self._totals = (sum(gpus for _, gpus, _, _ in queued), sum(value for _, _, value, _ in queued))
        return self._totals

    def enqueue(self, job_id: str, entry: tuple[tuple, int, float, float]) -> None:
        """A backlog job (order, GPUs, $ per s, duration); one that asks for no GPU waits for none: not queued."""
        if entry[1] <= 0:
            return
        self.queued[job_id] = entry
        self._changed()

    def leave(self, job_id: str) -> None:
        if self.queued.pop(job_id, None) is not None:
            self._changed()

    def _changed(self) -> None:
        self._in_order = self._totals = None
        self._waits.clear()

    def hold(self, end: float, gpus: int) -> None:
        """`gpus` busy until `end` (the kind's plans, made without them, are dropped)."""
        if end not in self.ends:
            bisect.insort(self._times, end)
            self.ends[end] = 0
        self.ends[end] += gpus
        self.busy += gpus
        self._waits.clear()

    def start(self, end: float, gpus: int) -> None:
        """`gpus` of the free ones taken until `end`."""
        self.free -= gpus
        self.hold(end, gpus)

    def waits(self, now: float, taken: int) -> "Plan":
        """Each backlog job's expected start once `taken` of the free GPUs are taken: the backlog in queue order, each
        job on the first GPUs back (free ones now, busy ones at their expected ends, its predecessors' at theirs);
        past every GPU the kind has, never (per `taken`; rebuilt after a start). GPUs coming back at one moment are
        one entry (time, count): a plan costs the running jobs and the backlog, not every GPU."""
        out = self._waits.get(taken)
        if out is None:
            order = self._order()
            idle = max(self.free - taken, 0)
            # the jobs that fit on the idle GPUs, in queue order, start now: planned at once (they wait nothing, so
            # only the GPUs they give back at their ends and what their time is worth carry on)
            first = bisect.bisect_right(self._gpus, idle) - 1
            back = [[now + duration, gpus] for _, gpus, _, duration in order[:first]]
            if idle > self._gpus[first]:
                back.append([now, idle - self._gpus[first]])
            heapq.heapify(back)
            out = self._waits[taken] = Plan(
                now=now,
                order=order,
                after=self._after,
                times=self._times,
                ends=self.ends,
                total=idle + self.busy,
                back=back,
                planned=first,
                _value=[self._values[first]],
            )
        return out

    def displaced(self, taken: int) -> int:
        """How many backlog jobs, next in line, would start now on the free GPUs but not once `taken` of them are
        taken (the first jobs of the plan of `taken`)."""
        self._order()
        now_free = bisect.bisect_right(self._gpus, self.free) - 1
        return max(0, now_free - (bisect.bisect_right(self._gpus, max(self.free - taken, 0)) - 1))

    def _order(self) -> list[tuple[tuple, int, float, float]]:
        """`queued` in queue order, with the prefix sums of its GPUs and values and the suffix sums of its values."""
        if self._in_order is None:
            self._in_order = order = sorted(self.queued.values())
            self._gpus = [*itertools.accumulate((gpus for _, gpus, _, _ in order), initial=0)]
            self._values = [*itertools.accumulate((v for _, _, v, _ in order), initial=0.0)]
            self._after = [*itertools.accumulate((v for _, _, v, _ in reversed(order)), initial=0.0)]
            self._after.reverse()
        return self._in_order


@dataclass(slots=True)
class Plan:
    """A kind's backlog planned in queue order, only as far as asked: each job takes the first GPUs back, so the
    starts never go down along the queue, and `relief(cut)` needs only the jobs that start before `cut` (every later
    one counts `cut` in full). The running jobs' ends join the heap of GPUs back only when they are next (valid until
    the kind changes: `Kind` drops its plans then)."""

    now: float
    order: list[tuple[tuple, int, float, float]]  # the backlog in queue order: (order, GPUs, $ per s, duration)
    after: list[float]  # after[i]: $ per s of order[i:]
    times: list[float]  # when busy GPUs come back, sorted (the kind's)
    ends: dict[float, int]  # how many then
    total: int  # GPUs the kind has for the backlog
    back: list[list]  # heap of [time, count]: GPUs back, those of `times` from `fed` on not yet in it
    fed: int = 0
    planned: int = 0  # jobs of `order` planned
    never: float = 0.0  # $ per s of the planned jobs that never start
    _at: list[float] = field(default_factory=list)  # the planned jobs' finite waits, in order (non-decreasing)
    _value: list[float] = field(default_factory=lambda: [0.0])  # prefix sums of their $ per s
    _weighted: list[float] = field(default_factory=lambda: [0.0])  # prefix sums of $ per s * wait
    _each: list[tuple[float, float]] = field(default_factory=list)  # (wait, $ per s) of each job planned, in order

    def relief(self, cut: float) -> float:
        """Sum over the backlog of $ per s * min(wait, cut)."""
        self._plan(cut)
        i = bisect.bisect_left(self._at, cut)
        later = self._value[-1] - self._value[i] + self.never + self.after[self.planned]
        return self._weighted[i] + cut * later

    def _plan(self, cut: float) -> None:
        """Plan on until a job waits `cut` or more (all after it wait as long) or the backlog is planned."""
        order, at = self.order, self._at
        while self.planned < len(order) and (not at or at[-1] < cut):
            _, gpus, value, duration = order[self.planned]
            self.planned += 1
            if gpus > self.total:
                self.never += value
                self._each.append((INF, value))
                continue
            start = self._take(gpus)
            heapq.heappush(self.back, [start + duration, gpus])
            wait = max(0.0, start - self.now)
            self._each.append((wait, value))
            at.append(wait)
            self._value.append(self._value[-1] + value)
            self._weighted.append(self._weighted[-1] + value * wait)

    def first(self, count: int, cut: float) -> list[tuple[float, float]]:
        """(wait, $ per s) of the first `count` jobs planned (those not planned by `cut` wait `cut` or more)."""
        self._plan(cut)
        found = self._each[:count]
        return found + [(INF, v) for _, _, v, _ in self.order[self.planned : self.planned + count - len(found)]]

    def _take(self, gpus: int) -> float:
        """Take the first `gpus` GPUs back; when the last of them is back."""
        back, times = self.back, self.times
        start = -INF
        while gpus:
            while self.fed < len(times) and (not back or times[self.fed] <= back[0][0]):
                t = times[self.fed]
                heapq.heappush(back, [t, self.ends[t]])
                self.fed += 1
            entry = back[0]
            start = entry[0]
            if entry[1] > gpus:
                entry[1] -= gpus
                return start
            gpus -= entry[1]
            heapq.heappop(back)
        return start


def delay_share(*, gpus: int, kind_gpus: int) -> float:
    """The share of a kind's capacity `gpus` of its `kind_gpus` GPUs are: holding them for d seconds delays a job
    that waits t by share * min(d, t)."""
    return gpus / max(kind_gpus, 1)


def delay_dollars(waits: "Waits | Plan", *, gpus: int, kind_gpus: int, held_s: float) -> float:
    """Dollars of waiting that holding `gpus` of a kind of `kind_gpus` GPUs for `held_s` seconds puts on jobs with
    these waits (or takes off them, when freed): each is delayed by gpus * min(held_s, its wait) / kind_gpus. The one
    rule of the contention charge and of make room (which then shortens the waits by it, `Waits.shorten`)."""
    return delay_share(gpus=gpus, kind_gpus=kind_gpus) * waits.relief(held_s)


def head_dollars(heads: Iterable[tuple[float, float]], *, share: float, held_s: float) -> float:
    """What the next jobs in line gain (or lose) beyond their share when g GPUs of a kind of N are freed (or taken)
    for `held_s`: they start on those GPUs now (or would have), so their whole wait up to `held_s` counts, not
    g / N of it (`delay_dollars` prices the share). `heads`: (wait, $ per s). The one rule of the contention charge
    and make room for the head of the line."""
    return (1 - share) * sum(value * min(wait, held_s) for wait, value in heads)


@dataclass(slots=True)
class Backlog:
    """Per queue of owned GPUs (`queue_keys`), what a placement there delays (see the module's doc); a placement is
    charged by every queue that holds its GPU."""

    now: float = 0.0
    # per (owned kinds, GPU models) a backlog job may use (`queue_keys`; no models: any)
    kinds: dict[QueueKey, Kind] = field(default_factory=dict)
    _holding: dict[tuple[str, str], list[Kind]] = field(default_factory=dict)  # (kind, model) -> queues of it

    def charge(self, job: JobRequest, option: Option) -> float:
        """Dollars of waiting this option of a job that may rent puts on the owned-only backlog that may use its GPU:
        g / N of each backlog job's wait up to the option's duration (N: the GPUs of that job's queue), and the whole
        of it for the jobs next in line that would have started now on the free GPUs it takes. A job that accepts
        only some GPU models is charged to an option on such a GPU, never on another model."""
        return sum(self._charge(kind, job, option) for kind in self._kinds_of(option))

    def _kinds_of(self, option: Option) -> list[Kind]:
        return self.holding(option_kind(option), option_model(option))

    def holding(self, kind: str, model: str) -> list[Kind]:
        """The queues a GPU of this owned kind and model serves."""
        found = self._holding.get((kind, model))
        if found is None:
            found = self._holding[(kind, model)] = [
                queue
                for (kinds, models), queue in self.kinds.items()
                if kind in kinds and (not models or model in models)
            ]
        return found

    def _charge(self, kind: Kind, job: JobRequest, option: Option) -> float:
        if not kind.value:
            return 0.0
        gpus = job.gpu_count * job.node_count
        if kind.demand + gpus <= kind.free:
            return 0.0  # room for the backlog and this job: nobody waits for it
        plan = kind.waits(self.now, gpus)
        share = delay_dollars(plan, gpus=gpus, kind_gpus=kind.gpus, held_s=option.duration)
        heads = plan.first(kind.displaced(gpus), option.duration)
        return share + head_dollars(heads, share=delay_share(gpus=gpus, kind_gpus=kind.gpus), held_s=option.duration)

    def started(self, job: JobRequest, option: Option, *, owned_only: bool) -> None:
        """Account for a start decided this pass (the GPUs it takes until it ends, in every queue that holds them; an
        owned-only job leaves every queue it is in)."""
        if owned_only:
            for other in self.kinds.values():
                other.leave(job.id)
        for kind in self._kinds_of(option):
            kind.start(self.now + option.duration, job.gpu_count * job.node_count)


def backlog(
    state: ClusterState,
    *,
    now: float,
    config: PolicyConfig,
    owned_only: dict[str, tuple[str, ...]],
    value_per_s: dict[str, float],
) -> Backlog:
    """The backlog at the start of a pass: `owned_only` maps each queued job that may not rent to its kinds. Each job
    queues once, on every owned GPU of its owned kinds and of the models it accepts (`queue_keys`)."""
    out = Backlog(now=now)
    keys = {}
    for job in state.queue:
        kinds = owned_only.get(job.id)
        if kinds is not None:
            keys[job.id] = queue_keys(kinds, job.gpu_models, one=config.one_owned_queue)
            for key in keys[job.id]:
                out.kinds.setdefault(key, Kind())
    kind_of: dict[str, list[Kind]] = {}
    for node in state.nodes:
        if node.kind in OWNED_KINDS:
            held = kind_of[node.id] = out.holding(node.kind, node.gpu_model)
            for kind in held:
                kind.gpus += node.gpu_count
                if node.is_ready(now) and node.reserved_for is None:
                    kind.free += node.free_gpus
    for run in state.running:
        end = expected_end(run, now)
        for node_id, indices in zip(run.node_ids, run.gpu_indices, strict=True):
            for kind in kind_of.get(node_id, ()):
                kind.hold(end, len(indices))
    for job in state.queue:
        for key in keys.get(job.id, ()):
            gpus = job.gpu_count * job.node_count
            duration = job.duration_on(config.reference_tflops, config.reference_tflops)
            order = backlog_order(job, config, usage=state.usage_by_user)
            out.kinds[key].enqueue(job.id, (order, gpus, value_per_s[job.id], duration))
    return out


def queue_keys(kinds: Iterable[str], models: Iterable[str], *, one: bool = True) -> list[QueueKey]:
    """The queues an owned-only job waits in: one, over its owned kinds and the GPU models it accepts (none: any);
    not `one` (`PolicyConfig.one_owned_queue` off, round 9's plan): one per owned kind and per model. No owned kind,
    no queue."""
    owned = sorted(k for k in set(kinds) if k in OWNED_KINDS)
    accepted = sorted(models)
    if not owned:
        return []
    if one:
        return [(tuple(owned), tuple(accepted))]
    return [((kind,), (model,) if model else ()) for kind in owned for model in accepted or [""]]


def option_model(option: Option) -> str:
    views = [view for view, _ in option.picks] if option.picks else option.views
    return views[0].node.gpu_model if views else ""


def option_kind(option: Option) -> str:
    if option.action == "provision":
        return "on_demand"
    views = [view for view, _ in option.picks] if option.picks else option.views
    return views[0].node.kind if views else "on_demand"
