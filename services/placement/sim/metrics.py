"""Figures of one simulated run."""

from services.placement.sim.engine import Outcome
from services.placement.sim.trace import TraceJob


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarise(jobs: list[TraceJob], out: Outcome) -> dict[str, float | int]:
    """Completion time = finish - submit; utilisation over the makespan; dollars for rented nodes (on-demand, spot
    and both: `cloud_dollars`)."""
    done = [j for j in jobs if j.request.id in out.finished]
    jct = {j.request.id: out.finished[j.request.id] - j.request.submitted_at for j in done}
    ts = [jct[j.request.id] for j in done if j.request.priority == "time"]
    cs = [jct[j.request.id] for j in done if j.request.priority == "cost"]
    first = min((j.request.submitted_at for j in jobs), default=0.0)
    makespan = max(out.end_time - first, 0.0)
    misses = sum(1 for j in done if j.request.deadline is not None and out.finished[j.request.id] > j.request.deadline)
    return {
        "jobs": len(jobs),
        "finished": len(done),
        "unfinished": len(jobs) - len(done),
        "avg_jct_s": round(_mean(list(jct.values())), 1),
        "p99_jct_s": round(_p99(list(jct.values())), 1),
        "avg_jct_time_sensitive_s": round(_mean(ts), 1),
        "avg_jct_cost_sensitive_s": round(_mean(cs), 1),
        "makespan_s": round(makespan, 1),
        "on_demand_node_hours": round(out.od_node_seconds / 3600, 2),
        "on_demand_dollars": round(out.od_dollars, 2),
        "on_demand_nodes_created": out.od_nodes_created,
        "spot_node_hours": round(out.spot_node_seconds / 3600, 2),
        "spot_dollars": round(out.spot_dollars, 2),
        "spot_nodes_created": out.spot_nodes_created,
        "cloud_dollars": round(out.od_dollars + out.spot_dollars, 2),
        "spot_interruptions": out.interruptions,
        "jobs_interrupted": out.jobs_interrupted,
        "lost_compute_h": round(out.lost_compute_s / 3600, 2),
        "owned_utilisation": (
            round(out.owned_busy_gpu_s / (out.owned_gpus * makespan), 4) if makespan and out.owned_gpus else 0.0
        ),
        "deadline_misses": misses + (len(jobs) - len(done)),
        "pullbacks": out.pullbacks,
        "moves_to_make_room": out.moves_to_make_room,
        "passes": out.passes,
        "policy_ms_per_pass": round(1000 * out.policy_seconds / max(out.passes, 1), 3),
    }
