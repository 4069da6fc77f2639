"""A new job's price (from placement's candidates) and billing's admission of it against quotas and budgets."""

from shared.bus import RPC_ADMIT
from shared.jobs import JobCreate
from shared.rpc import AdmitQuery, AdmitReply, Candidate, CandidatesReply
from services.submitter.refusals import NotAdmitted
from services.submitter.rpc import Requester

DEFAULT_DURATION_S = 3600  # a job without expected_duration_s is priced as one hour
DEFAULT_PRICE_PER_HOUR = 4.0  # when no node fits the job, or placement does not answer


def price(body: JobCreate, answer: CandidatesReply | None) -> tuple[float, float]:
    """(dollars, GPU-hours) of the placement the policy would decide (placement lists it first: the price shown is
    the price decided); the default price when none fits or placement did not answer (`answer` None: a silent
    placement must not stop submissions)."""
    resource = body.spec.resource
    gpus = resource.gpu_count * resource.node_count
    if (decided := first(answer)) is None:
        hours = (body.spec.placement.expected_duration_s or DEFAULT_DURATION_S) / 3600
        return DEFAULT_PRICE_PER_HOUR * resource.node_count * hours, gpus * hours
    return decided.expected_cost, gpus * decided.predicted_duration_s / 3600


def price_per_hour(body: JobCreate, answer: CandidatesReply | None) -> float:
    """Dollars an hour of the job's run as admission prices it: its cost over its predicted duration (a job
    without GPUs too: by GPU-hours, a CPU-only search's budget in dollars was never spent)."""
    if (decided := first(answer)) is None:
        return DEFAULT_PRICE_PER_HOUR * body.spec.resource.node_count
    hours = decided.predicted_duration_s / 3600
    return decided.expected_cost / hours if hours > 0 else 0.0


def first(answer: CandidatesReply | None) -> Candidate | None:
    """The placement the policy would decide (placement lists it first); None where none fits or none answered."""
    return answer.candidates[0] if answer and answer.candidates else None


async def admit(
    requester: Requester, *, project_id: str, user_name: str, body: JobCreate, answer: CandidatesReply | None
) -> None:
    """Ask billing once, at the price placement's `answer` gives; NotAdmitted (billing's code: 406008 quota,
    406029 budget) for a job the project's or user's quota or budget cannot take."""
    cost, gpu_hours = price(body, answer)
    reply = AdmitReply.model_validate(
        await requester.ask(
            RPC_ADMIT,
            AdmitQuery(
                project_id=project_id,
                user_name=user_name,
                purpose="submit",
                gpus=body.spec.resource.gpu_count * body.spec.resource.node_count,
                estimated_cost=cost,
                estimated_gpu_hours=gpu_hours,
            ),
        )
    )
    if not reply.allowed:
        raise NotAdmitted(reply.reason, code=reply.error_code, status=reply.http_status)
