"""`trainmaster` and `wait-local`: fair-share queue, backfill behind reservations, time/cost rules."""

from services.placement.policy.capacity import INF
from services.placement.policy.config import PolicyConfig
from services.placement.policy.contention import Backlog, backlog
from services.placement.policy.decisions import Decision
from services.placement.policy.makeroom import make_room
from services.placement.policy.market import pick_market
from services.placement.policy.models import ClusterState
from services.placement.policy.options import backlog_value_per_s, job_kinds, node_options, provision_options
from services.placement.policy.passes import ALL_KINDS, OWNED_ONLY, FairQueue, Pass
from services.placement.policy.pullback import pull_back


def schedule_trainmaster(state: ClusterState, now: float, config: PolicyConfig) -> list[Decision]:
    """Our policy: may pay for on-demand nodes when the job's rule says so, and pulls long jobs back."""
    return _schedule(state, now, config, kinds=ALL_KINDS)


def schedule_wait_local(state: ClusterState, now: float, config: PolicyConfig) -> list[Decision]:
    """The same rules on owned capacity only: never pays."""
    return _schedule(state, now, config, kinds=OWNED_ONLY)


def _schedule(state: ClusterState, now: float, config: PolicyConfig, *, kinds: frozenset[str]) -> list[Decision]:
    p = Pass(state, now=now, config=config, kinds=kinds)
    queue = FairQueue(state.queue, state.usage_by_user, charge_cap_s=config.fair_share_charge_cap_s, config=config)
    blocked: dict[tuple | None, float] = {}  # owned-only shape -> shortest duration that found nothing free this pass
    waits = _backlog(p) if "on_demand" in kinds else None
    for job in queue.take(config.max_jobs_per_pass):
        allowed = job_kinds(job, kinds)
        rents = p.rents(job)  # a shape that may rent is never blocked: no tuple to build for it
        shape = (
            None
            if rents
            else (
                allowed,
                *job.needs,
            )
        )
        base = job.duration_on(config.reference_tflops, config.reference_tflops)
        if (
            p.reservations >= config.reservation_depth
            and base >= (INF if rents else blocked.get(shape, INF))
            and job.id not in p.index.claimed
        ):
            p.wait(job, "waiting for owned capacity")  # capacity only shrinks in a pass: nothing free for it
            continue
        options = node_options(job, p.index, kinds=allowed, config=config, wait=True)
        if not rents and not any(o.action == "start" for o in options):
            blocked[shape] = min(base, blocked.get(shape, INF))
        if rents:
            if waits is not None:
                for option in options:
                    option.charge = waits.charge(job, option)
            options += provision_options(job, state.catalogue, now=now, config=config)
        if not options:
            p.wait(job, "no node or instance type can host this job")
            continue
        choice = pick_market(options, job, now=now, config=config)
        p.apply(job, choice)
        if waits is not None and choice.action == "start":
            waits.started(job, choice, owned_only=not rents)
        if choice.action != "wait":
            queue.charge(job, choice.duration)
    if waits is not None:
        make_room(p)
    examined_all = len(state.queue) <= config.max_jobs_per_pass
    if "on_demand" in kinds and examined_all and (p.waiting == 0 or not config.pullback_only_when_queue_empty):
        pull_back(p)
    p.release_idle()
    return p.decisions


def _backlog(p: Pass) -> Backlog:
    """The jobs queued at the start of the pass that can only run on owned capacity (they may not rent, or no
    instance type could host them), and what their time is worth."""
    state, config = p.state, p.config
    owned_only = {job.id: job_kinds(job, p.kinds) for job in state.queue if job.gpu_count and not p.rents(job)}
    values = {job.id: backlog_value_per_s(job, config) for job in state.queue if job.id in owned_only}
    return backlog(state, now=p.now, config=config, owned_only=owned_only, value_per_s=values)
