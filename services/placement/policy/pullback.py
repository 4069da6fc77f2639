"""Pull-back: move a long job from a paid on-demand node to an owned node that has gone idle."""

from services.placement.policy.capacity import NodeView, expected_end
from services.placement.policy.decisions import PullBack
from services.placement.policy.models import KINDS_FOR_ALLOWED, OWNED_KINDS, RunningJob
from services.placement.policy.options import share_per_hour, time_value_per_s
from services.placement.policy.passes import Pass


def pull_back(p: Pass) -> None:
    """Most expensive remaining on-demand work first; each move must save more than it costs."""
    config, now, index = p.config, p.now, p.index
    if not any(any(sets[1:]) for key, sets in index.free_now.items() if key[0] in OWNED_KINDS):
        return
    candidates = []
    for run in p.state.running:
        view = index.view(run.node_ids[0]) if len(run.node_ids) == 1 else None
        remaining = expected_end(run, now) - now
        if view is None or run.moving or view.node.kind != "on_demand" or remaining < config.pullback_min_remaining_s:
            continue
        hourly = share_per_hour([view], run.job.gpu_count)
        candidates.append((hourly * remaining, run, view, remaining, hourly))
    candidates.sort(key=lambda c: -c[0])
    moved = 0
    for _, run, od_view, remaining, od_hourly in candidates:
        if moved >= config.max_pullbacks_per_pass:
            break
        best = _best_target(p, run, od_view.node.tflops, remaining, od_hourly)
        if best is None:
            continue
        view, indices, total = best
        p.index.start(view, indices, end=now + total, job=run.job)
        od_view.touched = True
        p.decisions.append(PullBack(run.job.id, od_view.node.id, view.node.id, indices))
        moved += 1


def _best_target(
    p: Pass, run: RunningJob, od_tflops: float, remaining: float, od_hourly: float
) -> tuple[NodeView, tuple[int, ...], float] | None:
    config, now, index, job = p.config, p.now, p.index, run.job
    kinds = tuple(k for k in KINDS_FOR_ALLOWED[job.allowed] if k in OWNED_KINDS)
    best, best_net = None, 0.0
    for key in index.eligible(job, kinds):
        duration = remaining * od_tflops / index.buckets[key].tflops
        total = config.migration_s + duration
        if job.priority == "time" and now + total > run.expected_end_at + config.pullback_max_slowdown * remaining:
            continue
        picks = index.find_free(key, job, duration=total, limit=config.max_nodes_scanned)
        if picks is None:
            continue
        view, indices = picks[0]
        owned_hourly = share_per_hour([view], job.gpu_count)
        saving = (od_hourly * remaining - owned_hourly * duration) / 3600
        migration_cost = (od_hourly + owned_hourly) * config.migration_s / 3600 + config.migration_fixed_cost
        later = max(0.0, now + total - max(run.expected_end_at, now))  # the time the move costs, at the rate
        net = saving - migration_cost - time_value_per_s(job, config) * later
        if net > best_net:
            best, best_net = (view, indices, total), net
    return best
