"""Could any node of the fleet or the on-demand catalogue ever hold this job? Placement's dry run answers (the one
asked for the submission); when it says no, the fields to blame are found by relaxing them one by one and asking
again (only for refused jobs)."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shared.jobs import Spec
from shared.rpc import CandidatesReply
from services.submitter.refusals import Invalid
from services.submitter.rpc import Requester

KINDS = {"local": 1, "cloud": 2, "any": 3}  # node kinds each `spec.placement.allowed` admits (placement's KINDS)
FEASIBLE_TIMEOUT_S = 2.0  # each relaxed question about a refused job waits no longer than this


@dataclass(frozen=True)
class Relaxation:
    field: str
    applies: Callable[[Spec], bool]
    relax: Callable[[dict[str, Any]], None]


RELAXATIONS = (
    Relaxation(
        "spec.resource.node_count", lambda s: s.resource.node_count > 1, lambda d: d["resource"].update(node_count=1)
    ),
    Relaxation(
        "spec.placement.gpu_models",
        lambda s: bool(s.placement.gpu_models),
        lambda d: d["placement"].update(gpu_models=[]),
    ),
    Relaxation(
        "spec.resource.min_gpu_memory_gb",
        lambda s: s.resource.min_gpu_memory_gb > 0,
        lambda d: d["resource"].update(min_gpu_memory_gb=0),
    ),
    Relaxation(
        "spec.resource.gpu_count",
        lambda s: s.resource.gpu_count > 0,
        lambda d: d["resource"].update(gpu_count=0, min_gpu_memory_gb=0),
    ),
    Relaxation(
        "spec.resource.cpu_count",
        lambda s: s.resource.cpu_count > 0.001,
        lambda d: d["resource"].update(cpu_count=0.001),
    ),
    Relaxation(
        "spec.resource.memory_gb",
        lambda s: (s.resource.memory_gb or 0) > 0.001,
        lambda d: d["resource"].update(memory_gb=0.001),
    ),
    Relaxation(
        "spec.placement.allowed", lambda s: s.placement.allowed != "any", lambda d: d["placement"].update(allowed="any")
    ),
)


def never_placeable(spec: Spec, answer: CandidatesReply) -> bool:
    """Every node kind the job allows is one no node or instance type could ever host it on."""
    return not answer.candidates and len(answer.unplaceable_kinds) >= KINDS[spec.placement.allowed]


def relaxed(spec: Spec, relaxations: list[Relaxation]) -> Spec:
    data = spec.model_dump(mode="json")
    for relaxation in relaxations:
        relaxation.relax(data)
    return Spec.model_validate(data)


async def blame(spec: Spec, placeable: Callable[[Spec], Awaitable[bool]]) -> list[str]:
    """The fields that, relaxed together, make the job placeable; none of them can be kept as asked."""
    chosen: list[Relaxation] = []
    for relaxation in (r for r in RELAXATIONS if r.applies(spec)):
        chosen.append(relaxation)
        if await placeable(relaxed(spec, chosen)):
            break
    else:
        return []
    for relaxation in reversed(chosen):  # the later, broader relaxations go first (gpu_count covers its memory)
        rest = [r for r in chosen if r is not relaxation]
        if rest and await placeable(relaxed(spec, rest)):
            chosen = rest
    return [r.field for r in chosen]


def refusal(fields: list[str], answer: CandidatesReply) -> Invalid:
    why = "; ".join(f"{kind}: {reason}" for kind, reason in sorted(answer.unplaceable_kinds.items()))
    named = fields or ["spec.resource"]
    also = f" (together with {', '.join(f'param[{f}]' for f in named[1:])})" if len(named) > 1 else ""
    return Invalid(named[0], f"no node of the fleet or the on-demand catalogue could ever hold this job{also} ({why})")


async def check(spec: Spec, answer: CandidatesReply, ask: Callable[[Spec], Awaitable[CandidatesReply]]) -> None:
    """Refuse (Invalid, naming the field) a job nothing could ever hold."""
    if not never_placeable(spec, answer):
        return

    async def placeable(candidate: Spec) -> bool:
        return not never_placeable(candidate, await ask(candidate))

    raise refusal(await blame(spec, placeable), answer)


def asker(requester: Requester, *, project_id: str, user_name: str) -> Callable[[Spec], Awaitable[CandidatesReply]]:
    """Placement's dry run of a spec, for this caller."""

    async def ask(spec: Spec) -> CandidatesReply:
        return await requester.spec_candidates(
            spec, project_id=project_id, user_name=user_name, timeout=FEASIBLE_TIMEOUT_S
        )

    return ask


async def refuse_unplaceable(
    requester: Requester, spec: Spec, answer: CandidatesReply | None, *, project_id: str, user_name: str
) -> None:
    """Invalid for a job no node nor instance type could ever hold, judged on placement's `answer` to the
    submission; without one (placement away) the job is taken: it waits in the queue, submissions do not stop
    with placement. Only a refused job asks again (to find the fields to blame)."""
    if answer is not None:
        await check(spec, answer, asker(requester, project_id=project_id, user_name=user_name))
