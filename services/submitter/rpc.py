"""Asking the services that own an answer, over request/reply: one way to do it, one error when they are away."""
import asyncio
import time
from typing import Any

from fastapi import Request
from nats.errors import NoRespondersError

from shared.bus import RPC_CANDIDATES
from shared.jobs import JobCreate, Parameter, Spec
from shared.rpc import CandidatesQuery, CandidatesReply
from services.submitter import errors
from services.submitter.errors import ApiError

TIMEOUT_S = 5
NO_RESPONDER_RETRY_S = 0.25


async def ask(request: Request, subject: str, payload: Any, *, timeout: float | None = None) -> Any:
    """The decoded reply; 503 (406003) naming the service, with Retry-After, when it does not answer. While nobody
    listens (a replica taking over as leader, a service restarting) the question is asked again within `timeout`."""
    deadline = time.monotonic() + (TIMEOUT_S if timeout is None else timeout)
    while True:
        try:
            left = max(0.1, deadline - time.monotonic())
            reply = await request.app.state.broker.request(payload, subject, timeout=left)
            return await reply.decode()
        except NoRespondersError as exc:
            if time.monotonic() + NO_RESPONDER_RETRY_S < deadline:
                await asyncio.sleep(NO_RESPONDER_RETRY_S)
                continue
            error = exc
        except Exception as exc:
            error = exc
        raise ApiError(503, errors.SERVICE_UNAVAILABLE, f"{subject.split('.')[2]} service did not answer: "
                       f"{error!r}", headers={"Retry-After": "1"}) from None


async def candidates(request: Request, body: JobCreate, *, project_id: str, user_name: str) -> CandidatesReply:
    """Where the job could run, how long and at what cost (placement's dry run: the one pricing of a job)."""
    return await spec_candidates(request, body.spec, project_id=project_id, user_name=user_name,
                                 parameters=body.algorithm.parameters)


async def spec_candidates(request: Request, spec: Spec, *, project_id: str, user_name: str,
                          timeout: float | None = None, parameters: list[Parameter] | None = None) -> CandidatesReply:
    """Placement's dry run of a job's spec (with its parameters, the estimator's duration where it has one)."""
    query = CandidatesQuery(spec=spec, user_name=user_name, project_id=project_id, parameters=parameters or [])
    return CandidatesReply.model_validate(await ask(request, RPC_CANDIDATES, query, timeout=timeout))
