"""The submitter's answer to a node's agent asking for the secrets of a task it is to start (`shared.jobsecrets`).

The node's word is a claim: it gets a job's secrets only when placement put that attempt's rank on it (the
placements the submitter keeps for output, `shared.origin`), that attempt is the job's newest, and the job has not
ended. A placement not read yet is a passing refusal (the agent asks again); anything else is final."""

import logging

from shared.jobs import FINISHED
from shared.jobsecrets import SecretsAnswer, SecretsQuery
from services.submitter.repository import Repository

log = logging.getLogger(__name__)

FINISHED_NAMES = frozenset(p.value for p in FINISHED)


def refused(reason: str, query: SecretsQuery, node_id: str) -> SecretsAnswer:
    log.warning(
        "refused node %s the secrets of job %s attempt %d rank %d: %s",
        node_id,
        query.job_id,
        query.attempt,
        query.rank,
        reason,
    )
    return SecretsAnswer(error=reason, final=True)


async def answer(repo: Repository, query: SecretsQuery, *, node_id: str) -> SecretsAnswer:
    """The job's secrets for `node_id`, which the server holds to its own subject; or why not."""
    origins = repo.origins
    if origins is None:
        return refused("this submitter keeps no placements to check a node against", query, node_id)
    nodes = await origins.nodes(query.job_id, query.attempt)
    if nodes is None:
        if await origins.all_read():
            return refused("that attempt was never placed", query, node_id)
        return SecretsAnswer(error="its placement is not read yet", final=False)
    if nodes.get(str(query.rank)) != node_id:
        return refused("that rank was not placed on this node", query, node_id)
    if (current := await origins.current_attempt(query.job_id)) is not None and query.attempt < current:
        return refused("a later attempt of the job was placed", query, node_id)
    found = await repo.secrets_of(query.job_id)
    if found is None:
        return refused("no such job", query, node_id)
    phase, values = found
    if phase in FINISHED_NAMES:
        return refused("the job has ended", query, node_id)
    return SecretsAnswer(values=values)
