"""Asking the services that own an answer, over request/reply: one way to do it, one refusal when they are away."""

from dataclasses import dataclass
from typing import Any

from faststream.nats import NatsBroker

from shared.asking import request
from shared.bus import RPC_CANDIDATES
from shared.jobs import JobCreate, Parameter, Spec
from shared.rpc import CandidatesQuery, CandidatesReply
from services.submitter.refusals import ServiceAway

TIMEOUT_S = 5


@dataclass(frozen=True)
class Requester:
    """The submitter's questions to the other services, over its broker."""

    broker: NatsBroker  # tests give a TestNatsBroker's, or a fake with request/publish/ping

    async def ask(self, subject: str, payload: Any, *, timeout: float | None = None) -> Any:
        """The decoded reply; ServiceAway naming the service when it does not answer. While nobody listens (a
        replica taking over as leader, a service restarting) the question is asked again within `timeout`."""
        try:
            reply = await request(self.broker, payload, subject, timeout=TIMEOUT_S if timeout is None else timeout)
            return await reply.decode()
        except Exception as exc:
            raise ServiceAway(subject.split(".")[2], exc) from None

    async def candidates(self, body: JobCreate, *, project_id: str, user_name: str) -> CandidatesReply:
        """Where the job could run, how long and at what cost (placement's dry run: the one pricing of a job)."""
        return await self.spec_candidates(
            body.spec, project_id=project_id, user_name=user_name, parameters=body.algorithm.parameters
        )

    async def spec_candidates(
        self,
        spec: Spec,
        *,
        project_id: str,
        user_name: str,
        timeout: float | None = None,
        parameters: list[Parameter] | None = None,
    ) -> CandidatesReply:
        """Placement's dry run of a job's spec (with its parameters, the estimator's duration where it has one)."""
        query = CandidatesQuery(spec=spec, user_name=user_name, project_id=project_id, parameters=parameters or [])
        return CandidatesReply.model_validate(await self.ask(RPC_CANDIDATES, query, timeout=timeout))
