"""Discrete-event replay of a trace against the placement policy (the very functions the service calls)."""

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from services.placement.policy import (
    ClusterState,
    InstanceType,
    JobRequest,
    MakeRoom,
    Node,
    PolicyConfig,
    Provision,
    PullBack,
    Release,
    RunningJob,
    Start,
    Wait,
    schedule,
)
from services.placement.policy.engine import Constraint, place
from services.placement.policy.hosting import as_node
from services.placement.policy.models import NodeKind
from services.placement.policy.options import waited_s
from services.placement.policy.spot import DEFAULT_INTERRUPTIONS_PER_HOUR
from services.placement.sim.durations import DurationSource
from services.placement.sim.spot import interruption_after_s, kept_compute_s
from services.placement.sim.trace import TraceJob

USAGE_HALF_LIFE_S = 7 * 86400.0  # fair share remembers about a week of usage
ARRIVE, FINISH, WAKE, TICK, INTERRUPT = 0, 1, 2, 3, 4


@dataclass(slots=True)
class SimNode:
    """One node's state as the replay changes it, event by event (its free GPUs as a set, the GPU-seconds it was
    busy, when it was rented). Not a second node record: it is made from the policy's `Node` (`of`) and each pass
    sees it as one again (`snapshot`), as the service's fleet hands the policy a `Node` per node record."""

    id: str
    kind: NodeKind
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: float
    tflops: float
    cpu: float
    memory_gb: float
    price_per_hour: float
    free: set[int]
    free_cpu: float
    free_memory_gb: float
    instance_type: str | None = None
    ready_at: float | None = None
    reserved_for: str | None = None
    idle_since: float | None = None
    created_at: float = 0.0
    busy_gpu_s: float = 0.0
    spot: bool = False

    @classmethod
    def of(cls, node: Node, *, created_at: float = 0.0) -> "SimNode":
        """The replay's state of a node the policy sees as `node`."""
        return cls(
            node.id,
            node.kind,
            node.gpu_model,
            node.gpu_count,
            node.gpu_memory_gb,
            node.tflops,
            node.cpu,
            node.memory_gb,
            node.price_per_hour,
            set(node.free_gpu_indices),
            node.free_cpu,
            node.free_memory_gb,
            instance_type=node.instance_type,
            ready_at=node.ready_at,
            reserved_for=node.reserved_for,
            idle_since=node.idle_since,
            created_at=created_at,
            spot=node.spot,
        )

    def snapshot(self) -> Node:
        return Node(
            self.id,
            self.kind,
            self.gpu_model,
            self.gpu_count,
            self.gpu_memory_gb,
            self.tflops,
            self.cpu,
            self.memory_gb,
            self.price_per_hour,
            tuple(sorted(self.free)),
            self.free_cpu,
            self.free_memory_gb,
            instance_type=self.instance_type,
            ready_at=self.ready_at,
            idle_since=self.idle_since,
            reserved_for=self.reserved_for,
            spot=self.spot,
        )


@dataclass(slots=True)
class Segment:
    node_ids: tuple[str, ...]
    indices: tuple[tuple[int, ...], ...]
    start: float
    end: float
    tflops: float
    token: int


@dataclass(slots=True)
class Outcome:
    finished: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    od_node_seconds: float = 0.0
    od_dollars: float = 0.0
    od_nodes_created: int = 0
    spot_node_seconds: float = 0.0
    spot_dollars: float = 0.0
    spot_nodes_created: int = 0
    interruptions: int = 0  # spot nodes the cloud took back
    jobs_interrupted: int = 0
    lost_compute_s: float = 0.0  # computed since a job's last checkpoint when its node was taken back
    pullbacks: int = 0
    moves_to_make_room: int = 0  # running jobs moved off owned GPUs to rentals (policy/makeroom.py)
    owned_busy_gpu_s: float = 0.0
    owned_gpus: int = 0
    passes: int = 0
    policy_seconds: float = 0.0
    end_time: float = 0.0


class Simulation:
    def __init__(
        self,
        jobs: list[TraceJob],
        nodes: list[Node],
        *,
        catalogue: tuple[InstanceType, ...],
        config: PolicyConfig,
        durations: DurationSource | None = None,
        spot_seed: int = 0,
    ):
        self.jobs = {j.request.id: j for j in jobs}
        self.catalogue = catalogue
        self.types = {it.name: it for it in catalogue}
        self.config = config
        self.nodes = {n.id: SimNode.of(n) for n in nodes}
        self.cache: dict[str, Node] = {}
        self.queue: dict[str, JobRequest] = {}
        self.running: dict[str, RunningJob] = {}
        self.segments: dict[str, Segment] = {}
        self.work_left = {j.request.id: j.run_time_s for j in jobs}
        self.usage: dict[str, tuple[float, float]] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.out = Outcome(owned_gpus=sum(n.gpu_count for n in self.nodes.values()))
        self.durations = durations or DurationSource()
        self.ticks: set[float] = set()
        self.spot_seed = spot_seed
        self.restoring: set[str] = set()  # interrupted jobs: the next start first restores their checkpoint
        self.kept: dict[str, frozenset[str]] = {}  # jobs moved to make room -> the nodes rented for them
        self.waited: dict[str, float] = {}  # job -> seconds it waited in the queue before its current run
        for j in jobs:
            self._push(j.request.submitted_at, ARRIVE, j.request.id)

    def run(self) -> Outcome:
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, _, kind, key, token = heapq.heappop(self.events)
                if kind == ARRIVE:
                    self.queue[key] = self.durations.estimate(self.jobs[key].request)
                elif kind == FINISH and key in self.segments and self.segments[key].token == token:
                    self._finish(key, now)
                elif kind == WAKE and key in self.nodes:
                    self._wake(self.nodes[key], now)
                elif kind == INTERRUPT and key in self.nodes:
                    self._interrupt(self.nodes[key], now)
            self._pass(now)
        self.out.end_time = max(self.out.finished.values(), default=0.0)
        for node in list(self.nodes.values()):
            if node.kind == "on_demand":
                self._release(node.id, max(self.out.end_time, node.created_at))
        return self.out

    def _pass(self, now: float) -> None:
        state = ClusterState(
            nodes=tuple(self._node(n) for n in self.nodes),
            queue=tuple(self.queue.values()),
            running=tuple(self.running.values()),
            catalogue=self.catalogue,
            usage_by_user=self._usage(now),
        )
        started = time.perf_counter()
        kept = {j: Constraint(only=ids) for j, nodes in self.kept.items() if (ids := nodes & self.nodes.keys())}
        decisions = place(state, now, self.config, kept) if kept else schedule(state, now, self.config)
        self.out.policy_seconds += time.perf_counter() - started
        self.out.passes += 1
        for d in decisions:
            if type(d) is Wait:  # most decisions: checked first
                if d.retry_at is not None and d.retry_at > now and d.retry_at not in self.ticks:
                    self.ticks.add(d.retry_at)
                    self._push(d.retry_at, TICK, "")
            elif type(d) is Start:
                self._start(d, now)
            elif type(d) is Provision:
                self._provision(d, now)
            elif type(d) is Release:
                self._release(d.node_id, now)
            elif type(d) is PullBack:
                self._pull_back(d, now)
            elif type(d) is MakeRoom:
                self._make_room(d, now)

    def _node(self, node_id: str) -> Node:
        node = self.cache.get(node_id)
        if node is None:
            node = self.cache[node_id] = self.nodes[node_id].snapshot()
        return node

    def _usage(self, now: float) -> dict[str, float]:
        decay = math.log(2) / USAGE_HALF_LIFE_S
        return {u: v * math.exp(-decay * (now - t)) for u, (v, t) in self.usage.items()}

    def _charge(self, user: str, gpu_hours: float, now: float) -> None:
        value, at = self.usage.get(user, (0.0, now))
        self.usage[user] = (value * math.exp(-math.log(2) / USAGE_HALF_LIFE_S * (now - at)) + gpu_hours, now)

    def _push(self, at: float, kind: int, key: str, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, key, token))

    def _wake(self, node: SimNode, now: float) -> None:
        """A booted node with nothing on it starts its idle clock."""
        if node.idle_since is None and len(node.free) == node.gpu_count:
            node.idle_since = now
            self.cache.pop(node.id, None)
            self._push(now + self.config.idle_release_s, WAKE, node.id)

    def _take(self, node: SimNode, indices: tuple[int, ...], cpu: float, memory_gb: float, now: float) -> None:
        assert node.ready_at is None or node.ready_at <= now, f"{node.id} is not ready"
        assert set(indices) <= node.free, f"{node.id}: GPUs {indices} are not free"
        node.free -= set(indices)
        node.free_cpu -= cpu
        node.free_memory_gb -= memory_gb
        node.idle_since = None
        node.reserved_for = None
        self.cache.pop(node.id, None)

    def _give(self, node: SimNode, indices: tuple[int, ...], cpu: float, memory_gb: float, now: float) -> None:
        node.free |= set(indices)
        node.free_cpu += cpu
        node.free_memory_gb += memory_gb
        if node.kind == "on_demand" and len(node.free) == node.gpu_count:
            node.idle_since = now
            self._push(now + self.config.idle_release_s, WAKE, node.id)
        self.cache.pop(node.id, None)

    def _begin(
        self, job_id: str, node_ids: Sequence[str], indices: Sequence[tuple[int, ...]], *, now: float, start: float
    ) -> None:
        """Hold the GPUs from `now`; the job computes from `start` (later than now after a migration)."""
        job = self.jobs[job_id].request
        nodes = [self.nodes[n] for n in node_ids]
        for node, idx in zip(nodes, indices, strict=True):
            cpu, memory = job.cpu_on(node.cpu, node.gpu_count), job.memory_on(node.memory_gb, node.gpu_count)
            self._take(node, idx, cpu, memory, now)
        tflops = min(n.tflops for n in nodes)
        end = start + self.work_left[job_id] * self.config.reference_tflops / tflops
        self.seq += 1
        self.segments[job_id] = Segment(tuple(node_ids), tuple(indices), start, end, tflops, self.seq)
        self._push(end, FINISH, job_id, self.seq)
        left = self.work_left[job_id] / self.jobs[job_id].run_time_s
        base = job.predicted_duration_s if job.predicted_duration_s is not None else job.expected_duration_s
        expected_end = start + base * left * self.config.reference_tflops / tflops
        self.running[job_id] = RunningJob(job, tuple(node_ids), tuple(indices), start, expected_end)

    def _start(self, d: Start, now: float) -> None:
        job = self.queue.pop(d.job_id)
        self.waited[d.job_id] = waited_s(job, now)
        restore = self.config.migration_s if d.job_id in self.restoring else 0.0
        self.kept.pop(d.job_id, None)
        self.restoring.discard(d.job_id)
        self._begin(d.job_id, d.node_ids, d.gpu_indices, now=now, start=now + restore)
        self.out.started[d.job_id] = now
        self._charge(job.user, job.gpu_count * job.node_count * job.expected_duration_s / 3600, now)

    def _stop(self, job_id: str, now: float, *, kept_s: float | None = None) -> None:
        """Free the job's GPUs; it keeps `kept_s` seconds of this segment's computing (None: all of it)."""
        seg = self.segments.pop(job_id)
        job = self.jobs[job_id].request
        for node_id, idx in zip(seg.node_ids, seg.indices, strict=True):
            node = self.nodes[node_id]
            node.busy_gpu_s += len(idx) * max(0.0, now - seg.start)
            if node.kind != "on_demand":
                self.out.owned_busy_gpu_s += len(idx) * max(0.0, now - seg.start)
            cpu, memory = job.cpu_on(node.cpu, node.gpu_count), job.memory_on(node.memory_gb, node.gpu_count)
            self._give(node, idx, cpu, memory, now)
        computed = max(0.0, now - seg.start) if kept_s is None else kept_s
        done = computed * seg.tflops / self.config.reference_tflops
        self.work_left[job_id] = max(0.0, self.work_left[job_id] - done)
        del self.running[job_id]

    def _finish(self, job_id: str, now: float) -> None:
        self._stop(job_id, now)
        self.out.finished[job_id] = now
        self.durations.observe(self.jobs[job_id].request, self.jobs[job_id].run_time_s)

    def _provision(self, d: Provision, now: float) -> list[str]:
        it = self.types[d.instance_type]
        ids = []
        for _ in range(d.count):
            self.out.od_nodes_created += not it.spot
            self.out.spot_nodes_created += it.spot
            node_id = f"od-{self.out.od_nodes_created + self.out.spot_nodes_created:05d}"
            ids.append(node_id)
            rented = replace(
                as_node(it), id=node_id, ready_at=now + it.startup_delay_s, reserved_for=d.job_id, spot=it.spot
            )
            self.nodes[node_id] = SimNode.of(rented, created_at=now)
            self._push(now + it.startup_delay_s, WAKE, node_id)
            if it.spot:
                hazard = (
                    DEFAULT_INTERRUPTIONS_PER_HOUR if it.interruptions_per_hour is None else it.interruptions_per_hour
                )
                after = interruption_after_s(node_id, hazard_per_hour=hazard, seed=self.spot_seed)
                if math.isfinite(after):
                    self._push(now + after, INTERRUPT, node_id)
        return ids

    def _release(self, node_id: str, now: float) -> None:
        assert len(self.nodes[node_id].free) == self.nodes[node_id].gpu_count, f"{node_id} is not idle"
        node = self.nodes.pop(node_id)
        self.cache.pop(node_id, None)
        seconds = max(0.0, now - node.created_at)
        if node.spot:
            self.out.spot_node_seconds += seconds
            self.out.spot_dollars += seconds / 3600 * node.price_per_hour
        else:
            self.out.od_node_seconds += seconds
            self.out.od_dollars += seconds / 3600 * node.price_per_hour

    def _interrupt(self, node: SimNode, now: float) -> None:
        """The cloud takes a spot node back: its jobs keep what their last checkpoint holds and queue again (the
        policy re-places them, restoring first); the node is billed until now and gone."""
        self.out.interruptions += 1
        for job_id in [j for j, seg in self.segments.items() if node.id in seg.node_ids]:
            seg = self.segments[job_id]
            interval = self.jobs[job_id].request.checkpoint_interval_s
            if interval is None:
                raise AssertionError(f"{job_id} declares no checkpoint but ran on spot node {node.id}")
            elapsed = max(0.0, now - seg.start)
            kept = kept_compute_s(elapsed, checkpoint_interval_s=interval)
            self.out.lost_compute_s += elapsed - kept
            self.out.jobs_interrupted += 1
            self._stop(job_id, now, kept_s=kept)
            self.queue[job_id] = self._requeued(job_id, now)
            self.restoring.add(job_id)
        self._release(node.id, now)

    def _requeued(self, job_id: str, now: float) -> JobRequest:
        """The job as the queue sees it again: re-estimated, with the work its checkpoint holds taken off, queued
        from now with the wait before its run kept (its run is not waiting)."""
        job = self.durations.estimate(self.jobs[job_id].request)
        left = self.work_left[job_id] / self.jobs[job_id].run_time_s
        predicted = None if job.predicted_duration_s is None else job.predicted_duration_s * left
        return replace(
            job,
            expected_duration_s=job.expected_duration_s * left,
            predicted_duration_s=predicted,
            queued_at=now,
            waited_before_s=self.waited.get(job_id, 0.0),
        )

    def _pull_back(self, d: PullBack, now: float) -> None:
        self._stop(d.job_id, now)
        self._begin(d.job_id, (d.to_node_id,), (d.gpu_indices,), now=now, start=now + self.config.migration_s)
        self.out.pullbacks += 1

    def _make_room(self, d: MakeRoom, now: float) -> None:
        """Rent for the job, checkpoint it where it runs (it keeps all its computing) and queue it again, kept to the
        rented nodes (as the service keeps a job to nodes rented for it); the freed GPUs are placed at once."""
        ids = self._provision(Provision(d.instance_type, d.count, d.job_id), now)
        self._stop(d.job_id, now)
        self.queue[d.job_id] = self._requeued(d.job_id, now)
        self.restoring.add(d.job_id)
        self.kept[d.job_id] = frozenset(ids)
        self.out.moves_to_make_room += 1
        self._push(now, TICK, "")
