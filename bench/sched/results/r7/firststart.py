"""One cell replayed, each job's first start, the kind it first and last started on, and its on-demand dollars, as
JSON lines (a one-off driver over `groups.Recorded`; `groups.py` counts a moved job's wait to its last start).
Run with PYTHONPATH set to the code under test. Usage: firststart.py VARIANT LOCAL RESERVED OUT.jsonl"""

import json
import sys
from pathlib import Path

from services.placement.policy import PolicyConfig, Start
from services.placement.sim.catalogue import DEFAULT_CATALOGUE, REFERENCE_TFLOPS
from services.placement.sim.trace import TraceOptions, load_jobs, load_nodes

sys.path.insert(0, str(Path.cwd() / "bench" / "sched"))
from groups import Recorded  # noqa: E402

DATA = Path("../shared/data/alibaba-gpu-v2023")


class First(Recorded):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.first: dict[str, tuple[float, str]] = {}

    def _start(self, d: Start, now: float) -> None:
        self.first.setdefault(d.job_id, (now, self.nodes[d.node_ids[0]].kind))
        super()._start(d, now)


def main(variant: str, local: str, reserved: str, out: str) -> None:
    jobs, _ = load_jobs(DATA / f"openb_pod_list_{variant}.csv", TraceOptions(estimate_error=0.0))
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv", local=int(local), reserved=int(reserved))
    config = PolicyConfig(policy="trainmaster", reference_tflops=REFERENCE_TFLOPS)
    sim = First(jobs, nodes, catalogue=DEFAULT_CATALOGUE, config=config)
    res = sim.run()
    with open(out, "w") as f:
        for j in jobs:
            r = j.request
            if r.id not in res.finished:
                continue
            first, kind = sim.first[r.id]
            row = dict(
                id=r.id,
                allowed=r.allowed,
                priority=r.priority,
                gpus=r.gpu_count,
                submitted=r.submitted_at,
                first=first,
                first_kind=kind,
                last_kind=sim.kind_of.get(r.id),
                finished=res.finished[r.id],
                rented=round(sim.rented.get(r.id, 0.0), 4),
            )
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
