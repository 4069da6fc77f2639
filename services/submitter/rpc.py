"""Asking the services that own an answer, over request/reply: one way to do it, one error when they are away."""
from typing import Any

from fastapi import Request

from shared.bus import RPC_CANDIDATES
from shared.jobs import JobCreate, Spec
from shared.rpc import CandidatesQuery, CandidatesReply
from services.submitter import errors
from services.submitter.errors import ApiError

TIMEOUT_S = 5


async def ask(request: Request, subject: str, payload: Any, *, timeout: float = TIMEOUT_S) -> Any:
    """The decoded reply; 503 (406003) naming the service when it does not answer."""
    try:
        reply = await request.app.state.broker.request(payload, subject, timeout=timeout)
        return await reply.decode()
    except Exception as exc:
        raise ApiError(503, errors.SERVICE_UNAVAILABLE,
                       f"{subject.split('.')[2]} service did not answer: {exc!r}") from None


async def candidates(request: Request, body: JobCreate, *, project_id: str, user_name: str) -> CandidatesReply:
    """Where the job could run, how long and at what cost (placement's dry run: the one pricing of a job)."""
    return await spec_candidates(request, body.spec, project_id=project_id, user_name=user_name)


async def spec_candidates(request: Request, spec: Spec, *, project_id: str, user_name: str,
                          timeout: float = TIMEOUT_S) -> CandidatesReply:
    """Placement's dry run of a job's spec."""
    query = CandidatesQuery(spec=spec, user_name=user_name, project_id=project_id)
    return CandidatesReply.model_validate(await ask(request, RPC_CANDIDATES, query, timeout=timeout))
