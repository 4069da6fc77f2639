"""Round 11: why local-only jobs wait under trainmaster on `cpu0` 12+6 (the completion miss): while one of them is
queued, every few hours of the replay, the queue's size, the job's place in it, the local GPUs free, what holds the
local GPUs (allowed/priority: GPUs, average hours left) and the reason its Wait gives.
Usage: PYTHONPATH=. python bench/sched/results/r11/probe.py JOB_ID [POLICY] (cpu0 12+6 at sigma 0)"""

import sys
from collections import Counter

from services.placement.policy import ClusterState, PolicyConfig, PullBack, Wait, schedule
from services.placement.policy.passes import FairQueue
from services.placement.sim.catalogue import DEFAULT_CATALOGUE, REFERENCE_TFLOPS
from services.placement.sim.engine import Simulation
from services.placement.sim.trace import TraceOptions, load_jobs, load_nodes

DATA = "../shared/data/alibaba-gpu-v2023"
EVERY_S = 6 * 3600.0


class Started(Exception):
    """The watched job has started: the probe stops the replay."""


class Probe(Simulation):
    def __init__(self, *args, watch: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.watch, self.last = watch, -float("inf")
        self.last_listed: float | None = None
        self.pulled_local: list[tuple[float, str, float]] = []  # (when, job, expected seconds left then)

    def _pull_back(self, d: PullBack, now: float) -> None:
        if self.nodes[d.to_node_id].kind == "local":
            run = self.running[d.job_id]
            self.pulled_local.append((now, d.job_id, max(0.0, run.expected_end_at - now)))
        super()._pull_back(d, now)

    def _pass(self, now: float) -> None:
        if self.watch in self.out.started:
            raise Started
        if self.watch in self.queue and now - self.last >= EVERY_S:
            self.last = now
            self._report(now)
        super()._pass(now)

    def _report(self, now: float) -> None:
        queue = list(FairQueue(tuple(self.queue.values()), self._usage(now), charge_cap_s=3600.0).take(10**6))
        place = next(i for i, j in enumerate(queue) if j.id == self.watch)
        local = [n for n in self.nodes.values() if n.kind == "local"]
        free = sum(len(n.free) for n in local)
        held: Counter = Counter()
        left: Counter = Counter()
        local_ids = {n.id for n in local}
        for run in self.running.values():
            gpus = sum(len(i) for nid, i in zip(run.node_ids, run.gpu_indices, strict=True) if nid in local_ids)
            if gpus:
                key = f"{run.job.allowed}/{run.job.priority}"
                held[key] += gpus
                left[key] += gpus * max(0.0, run.expected_end_at - now) / 3600
        state_reason = ""
        state = ClusterState(
            nodes=tuple(self._node(n) for n in self.nodes),
            queue=tuple(self.queue.values()),
            running=tuple(self.running.values()),
            catalogue=self.catalogue,
            usage_by_user=self._usage(now),
        )
        for d in schedule(state, now, self.config):
            if getattr(d, "job_id", None) == self.watch:
                state_reason = d.reason if isinstance(d, Wait) else type(d).__name__
        ahead = Counter(f"{j.allowed}/{j.priority}" for j in queue[:place])
        on_local = {r.job.id for r in self.running.values() if local_ids & set(r.node_ids)}
        if self.last_listed is None:
            self.last_listed = now
            for r in sorted((r for r in self.running.values() if r.job.id in on_local), key=lambda r: r.started_at):
                print(
                    f"  on local: {r.job.id} {r.job.allowed}/{r.job.priority}"
                    f" submitted {r.job.submitted_at / 3600:,.0f} h"
                    f" started {r.started_at / 3600:,.0f} h, {max(0.0, r.expected_end_at - now) / 3600:,.0f} h left"
                )
        pulled = [(t, left) for t, j, left in self.pulled_local if j in on_local]
        print(
            f"  of the jobs on local GPUs, {len(pulled)} were pulled back there (expected hours left then: "
            f"{', '.join(f'{left / 3600:,.0f} at {t / 3600:,.0f} h' for t, left in pulled[:12])})"
        )
        print(
            f"t={now / 3600:,.1f} h queue {len(queue)} place {place} (ahead {dict(ahead)}); local free {free}; "
            f"held {{{', '.join(f'{k}: {held[k]} GPUs, {left[k] / held[k]:,.0f} h left' for k in held)}}}; "
            f"{state_reason}",
            flush=True,
        )


def main(watch: str, policy: str = "trainmaster", variant: str = "cpu0", local: int = 12, reserved: int = 6) -> None:
    jobs, _ = load_jobs(f"{DATA}/openb_pod_list_{variant}.csv", TraceOptions())
    nodes = load_nodes(f"{DATA}/openb_node_list_gpu_node.csv", local=local, reserved=reserved)
    config = PolicyConfig(policy=policy, reference_tflops=REFERENCE_TFLOPS)
    sim = Probe(jobs, nodes, catalogue=DEFAULT_CATALOGUE, config=config, watch=watch)
    try:
        sim.run()
    except Started:
        print(f"{watch} started at {sim.out.started[watch] / 3600:,.1f} h")


if __name__ == "__main__":
    main(*sys.argv[1:3])
