"""Per-pass view of GPU capacity, indexed so one job's search never scans the whole fleet.

Each GPU is a slot with the time it becomes available (`avail_at`) and the start of the earliest reservation
holding it (`hold_from`). A job may start now on a free slot only if it ends before `hold_from`: that is backfill
that never delays a reservation. Future capacity ignores CPU and memory (they are checked against the node's size).
"""

import heapq
import itertools
from dataclasses import dataclass

from services.placement.policy.models import ClusterState, JobRequest, Node, RunningJob

INF = float("inf")
UNKNOWN_BUSY_S = 3600.0  # a held GPU whose job we do not see is assumed busy this long
OVERRUN_MIN_S = 60.0
OVERRUN_FACTOR = 0.5
BucketKey = tuple[str, str, float, float, bool]


def expected_end(run: RunningJob, now: float) -> float:
    """A job past its estimate is assumed to need half as long again as it has run (not "any second now")."""
    if run.expected_end_at > now:
        return run.expected_end_at
    return now + max(OVERRUN_MIN_S, OVERRUN_FACTOR * (now - run.started_at))


def bucket_key(node: Node) -> BucketKey:
    return (node.kind, node.gpu_model, node.gpu_memory_gb, node.tflops, node.spot)


@dataclass(frozen=True, slots=True)
class Bucket:
    kind: str
    gpu_model: str
    gpu_memory_gb: float
    tflops: float
    spot: bool
    max_gpus: int


class NodeView:
    """Mutable copy of one node's capacity for the length of one pass."""

    __slots__ = ("node", "claimed_for", "free", "free_cpu", "free_mem", "avail_at", "hold_from", "version", "touched")

    def __init__(self, node: Node, busy_until: dict[int, float], now: float, claimed_for: str | None):
        self.node = node
        self.claimed_for = claimed_for
        ready = node.is_ready(now)
        self.free = sorted(node.free_gpu_indices) if ready else []
        self.free_cpu = node.free_cpu
        self.free_mem = node.free_memory_gb
        start = now if ready or node.ready_at is None else node.ready_at
        free_set = set(node.free_gpu_indices)
        self.avail_at = {
            i: start if i in free_set else busy_until.get(i, now + UNKNOWN_BUSY_S) for i in range(node.gpu_count)
        }
        self.hold_from = dict.fromkeys(range(node.gpu_count), INF)
        self.version = 0
        self.touched = False

    def usable_now(self, duration: float, now: float) -> list[int]:
        end = now + duration
        return [i for i in self.free if end <= self.hold_from[i]]

    def avail_for(self, gpus: int) -> float:
        return sorted(self.avail_at.values())[gpus - 1]

    def all_free_at(self) -> float:
        return max(self.avail_at.values())

    def start(self, indices: tuple[int, ...], *, end: float, cpu: float, memory_gb: float) -> None:
        for i in indices:
            self.free.remove(i)
            self.avail_at[i] = max(self.avail_at[i], end)
        self.free_cpu -= cpu
        self.free_mem -= memory_gb
        self.version += 1
        self.touched = True

    def reserve(self, gpus: int, *, start: float, end: float) -> None:
        chosen = sorted(self.avail_at, key=self.avail_at.__getitem__)[:gpus]
        for i in chosen:
            self.avail_at[i] = end
            self.hold_from[i] = min(self.hold_from[i], start)
        self.version += 1

    def claimed_by_other(self, job_id: str) -> bool:
        return self.claimed_for is not None and self.claimed_for != job_id


class CapacityIndex:
    """Nodes bucketed by (kind, model, GPU memory, TFLOPS).

    Per bucket: sets of nodes by free GPU count (start now) and lazy heaps of future availability (wait). A node's
    `NodeView` is built the first time a search looks at it (`view`): a dry run over 10,000 nodes builds a few dozen,
    not 10,000. Until then its free GPUs are read from the node itself.
    """

    def __init__(self, state: ClusterState, *, now: float, kinds: frozenset[str]):
        """A node provisioned or kept for a job stays claimed while it boots, while that job is queued and while it
        checkpoints to move there (a running job that is `moving`): no other job takes the target meanwhile."""
        self.now = now
        self._running = state.running
        self._busy: dict[str, dict[int, float]] | None = None
        queued = {job.id for job in state.queue} | {run.job.id for run in state.running if run.moving}
        self.nodes: dict[str, Node] = {}
        self.views: dict[str, NodeView] = {}  # built on first use; see `view`
        self._claims: dict[str, str] = {}
        self.buckets: dict[BucketKey, Bucket] = {}
        self.members: dict[BucketKey, list[str]] = {}
        free_count: dict[str, int] = {}
        for node in state.nodes:
            if node.kind not in kinds or node.gpu_count <= 0:
                continue
            node_id = node.id
            self.nodes[node_id] = node
            ready = node.is_ready(now)
            if node.reserved_for is not None and (node.reserved_for in queued or not ready):
                self._claims[node_id] = node.reserved_for
            free_count[node_id] = len(node.free_gpu_indices) if ready else 0
            key = bucket_key(node)
            old = self.buckets.get(key)
            if old is None or node.gpu_count > old.max_gpus:
                self.buckets[key] = Bucket(*key, max_gpus=node.gpu_count)
            self.members.setdefault(key, []).append(node_id)
        self._free_count = free_count
        self.free_now: dict[BucketKey, list[dict[str, None]]] = {}
        for key, bucket in self.buckets.items():
            sets: list[dict[str, None]] = [{} for _ in range(bucket.max_gpus + 1)]
            for node_id in self.members[key]:
                sets[free_count[node_id]][node_id] = None
            self.free_now[key] = sets
        self.claimed: dict[str, list[NodeView]] = {}
        for node_id, job_id in self._claims.items():
            self.claimed.setdefault(job_id, []).append(self.member(node_id))
        self._heaps: dict[tuple[BucketKey, int], list[tuple[float, int, str, int]]] = {}
        self._eligible: dict[tuple, list[BucketKey]] = {}

    def view(self, node_id: str) -> NodeView | None:
        """The node's capacity for this pass (None: not a node of the pass's kinds), built on first use."""
        view = self.views.get(node_id)
        if view is None:
            node = self.nodes.get(node_id)
            if node is None:
                return None
            view = self.views[node_id] = NodeView(node, self._busy_on(node), self.now, self._claims.get(node_id))
        return view

    def member(self, node_id: str) -> NodeView:
        """The view of a node of this pass: every id the buckets, heaps and claims hold is one."""
        view = self.view(node_id)
        if view is None:
            raise KeyError(f"{node_id} is not a node of this pass")
        return view

    def _busy_on(self, node: Node) -> dict[int, float]:
        """When each GPU of the node that a running job holds is expected back (all the running jobs read once)."""
        if len(node.free_gpu_indices) == node.gpu_count:
            return {}
        if self._busy is None:
            self._busy = {}
            for run in self._running:
                end = expected_end(run, self.now)
                for node_id, indices in zip(run.node_ids, run.gpu_indices, strict=True):
                    per_node = self._busy.setdefault(node_id, {})
                    for i in indices:
                        per_node[i] = end
        return self._busy.get(node.id, {})

    def _avail_for(self, node_id: str, gpus: int) -> tuple[float, int]:
        """When `gpus` GPUs of the node are first available, and the version of its view this was read from."""
        view = self.views.get(node_id)
        if view is None and 0 < gpus <= self._free_count[node_id]:
            return self.now, 0  # ready with enough GPUs free: a view built now would say the same (version 0)
        view = view or self.member(node_id)
        return view.avail_for(gpus), view.version

    def eligible(self, job: JobRequest, kinds: tuple[str, ...]) -> list[BucketKey]:
        """Buckets whose nodes could ever host one rank of `job`."""
        checkpoints = job.checkpoint_interval_s is not None
        shape = (kinds, job.gpu_models, job.min_gpu_memory_gb, job.gpu_count, checkpoints)
        found = self._eligible.get(shape)
        if found is None:
            found = [
                key
                for key, b in self.buckets.items()
                if b.kind in kinds
                and job.may_run_on(spot=b.spot)
                and job.accepts_model(b.gpu_model)
                and b.gpu_memory_gb >= job.min_gpu_memory_gb
                and b.max_gpus >= job.gpu_count
            ]
            self._eligible[shape] = found
        return found

    def find_free(
        self, key: BucketKey, job: JobRequest, *, duration: float, limit: int
    ) -> list[tuple[NodeView, tuple[int, ...]]] | None:
        """Best-fit nodes with enough GPUs free now for all ranks, without breaking any reservation."""
        picks: list[tuple[NodeView, tuple[int, ...]]] = []
        sets = self.free_now[key]
        claimed = self.claimed.get(job.id)
        own = [view.node.id for view in claimed if bucket_key(view.node) == key] if claimed else []
        if not own and not any(sets[job.gpu_count :]):
            return None  # no node of the bucket has enough GPUs free
        candidates = itertools.chain(own, *(sets[count] for count in range(job.gpu_count, len(sets))))
        for scanned, node_id in enumerate(candidates):
            if scanned >= limit + len(own):
                return None
            view = self.member(node_id)
            if len(view.free) < job.gpu_count or any(view is v for v, _ in picks):
                continue
            if (
                view.free_cpu < _cpu(job, view.node)
                or view.free_mem < _memory(job, view.node)
                or view.claimed_by_other(job.id)
            ):
                continue
            usable = view.usable_now(duration, self.now)
            if len(usable) >= job.gpu_count:
                picks.append((view, tuple(usable[: job.gpu_count])))
                if len(picks) == job.node_count:
                    return picks
        return None

    def earliest(self, key: BucketKey, job: JobRequest, *, limit: int) -> tuple[float, list[NodeView]] | None:
        """Earliest time `node_count` nodes of the bucket each have `gpu_count` GPUs, and those nodes."""
        heap = self._heap(key, job.gpu_count)
        popped: list[tuple[float, int, str, int]] = []
        own = self.claimed.get(job.id)
        picks: list[tuple[float, NodeView]] = (
            [
                (view.avail_for(job.gpu_count), view)
                for view in own
                if bucket_key(view.node) == key and view.node.gpu_count >= job.gpu_count
            ][: job.node_count]
            if own
            else []
        )
        if not picks and job.node_count == 1 and limit > 0:
            # The usual case, answered from the top of the heap without popping (entries are totally ordered by
            # their unique seq, so popping and pushing back would leave the same order).
            while heap:
                at, seq, node_id, version = heap[0]
                view = self.member(node_id)
                if version == view.version:
                    break
                heapq.heapreplace(heap, (view.avail_for(job.gpu_count), seq, node_id, view.version))
            else:
                return None
            node = view.node
            if view.claimed_for is None and node.cpu >= job.cpu and node.memory_gb >= _memory(job, node):
                if view.free_cpu < _cpu(job, node) or view.free_mem < _memory(job, node):
                    at = max(at, view.all_free_at())
                return at, [view]
        while heap and len(picks) < job.node_count and len(popped) < limit:
            entry = heapq.heappop(heap)
            at, seq, node_id, version = entry
            view = self.member(node_id)
            if version != view.version:
                heapq.heappush(heap, (view.avail_for(job.gpu_count), seq, node_id, view.version))
                continue
            popped.append(entry)
            node = view.node
            if view.claimed_for is not None or node.cpu < job.cpu or node.memory_gb < _memory(job, node):
                continue
            if view.free_cpu < _cpu(job, node) or view.free_mem < _memory(job, node):
                at = max(at, view.all_free_at())
            picks.append((at, view))
        for entry in popped:
            heapq.heappush(heap, entry)
        if len(picks) < job.node_count:
            return None
        return max(at for at, _ in picks), [view for _, view in picks]

    def start(self, view: NodeView, indices: tuple[int, ...], *, end: float, job: JobRequest) -> None:
        key = bucket_key(view.node)
        sets = self.free_now[key]
        sets[len(view.free)].pop(view.node.id, None)
        view.start(indices, end=end, cpu=_cpu(job, view.node), memory_gb=_memory(job, view.node))
        sets[len(view.free)][view.node.id] = None

    def _heap(self, key: BucketKey, gpus: int) -> list[tuple[float, int, str, int]]:
        heap = self._heaps.get((key, gpus))
        if heap is None:
            heap = []
            for seq, node_id in enumerate(self.members[key]):
                if self.nodes[node_id].gpu_count >= gpus:
                    at, version = self._avail_for(node_id, gpus)
                    heap.append((at, seq, node_id, version))
            heapq.heapify(heap)
            self._heaps[(key, gpus)] = heap
        return heap


def _memory(job: JobRequest, node: Node) -> float:
    return job.memory_on(node.memory_gb, node.gpu_count)


def _cpu(job: JobRequest, node: Node) -> float:
    return job.cpu_on(node.cpu, node.gpu_count)
