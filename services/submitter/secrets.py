"""The submitter's answer to a node's agent asking for the secrets of a task it is to start (`shared.jobsecrets`).

The node's word is a claim: it gets a job's secrets only when placement put that attempt's rank on it (the
placements the submitter keeps for output, `shared.origin`), no later attempt of the job was placed, and the job
has not ended. A placement not read yet is a passing refusal (the agent asks again); anything else is final.

Every replica of the submitter may answer (one of a queue group does): a placement not found is looked up again
after asking whether every placement was read (one another replica stored between the miss and that question would
otherwise be called never placed), and a later attempt is looked up in the stored records and the job's status too
(each replica's memory holds only the placements it read). A node asking about attempts never placed costs the
database nothing for `UNPLACED_S` after the first (`Origins.unplaced`, as its output does), and at most `RATE_PER_S`
requests a second from one node are looked at (`node_limiter`)."""

import logging

from shared.jobs import FINISHED
from shared.jobsecrets import SecretsAnswer, SecretsQuery
from shared.origin import UNPLACED_S, attempt_key
from services.submitter.limits import RateLimiter
from services.submitter.repository import Repository
from services.submitter.sealing import Sealer, Unreadable

log = logging.getLogger(__name__)

FINISHED_NAMES = frozenset(p.value for p in FINISHED)
RATE_PER_S, BURST = 20.0, 40.0  # a node's requests looked at; past them it is told to ask again later
NODES_KEPT = 4096


def node_limiter() -> RateLimiter:
    """A token bucket per node (the API's own per-user limiter)."""
    return RateLimiter(rate=RATE_PER_S, burst=BURST, max_keys=NODES_KEPT)


def refused(reason: str, query: SecretsQuery, node_id: str, *, said: bool = True) -> SecretsAnswer:
    if said:
        log.warning(
            "refused node %s the secrets of job %s attempt %d rank %d: %s",
            node_id,
            query.job_id,
            query.attempt,
            query.rank,
            reason,
        )
    return SecretsAnswer(error=reason, final=True)


async def answer(repo: Repository, query: SecretsQuery, *, node_id: str, sealer: Sealer) -> SecretsAnswer:
    """The job's secrets for `node_id`, which the server holds to its own subject; or why not."""
    origins = repo.origins
    if origins is None:
        return refused("this submitter keeps no placements to check a node against", query, node_id)
    key, now = attempt_key(query.job_id, query.attempt), origins.clock()
    if (found := origins.unplaced.get(key)) is not None and now - found < UNPLACED_S:
        return refused("that attempt was never placed", query, node_id, said=False)  # said when it was found
    nodes = await origins.nodes(query.job_id, query.attempt)
    if nodes is None:  # looked up again after asking whether all were read: one stored in between is found
        all_read = await origins.all_read()
        nodes = await origins.nodes(query.job_id, query.attempt)
    if nodes is None:
        if all_read:
            origins.unplaced.put(key, now)
            return refused("that attempt was never placed", query, node_id)
        return SecretsAnswer(error="its placement is not read yet", final=False)
    if nodes.get(str(query.rank)) != node_id:
        return refused("that rank was not placed on this node", query, node_id)
    # (a later attempt another replica read and has not stored yet, nor the job's status shown, is not seen: the
    # node asking ran this attempt and was given its secrets already; holding every start while placements are
    # being read would hold them for as long as jobs keep being placed)
    if await origins.later_placed(query.job_id, query.attempt):
        return refused("a later attempt of the job was placed", query, node_id)
    found_job = await repo.secrets_of(query.job_id)
    if found_job is None:
        return refused("no such job", query, node_id)
    phase, attempt, sealed = found_job
    if phase in FINISHED_NAMES:
        return refused("the job has ended", query, node_id)
    if attempt > query.attempt:
        return refused("a later attempt of the job was placed", query, node_id)
    if not sealed:  # none, or removed
        return SecretsAnswer(values={})
    try:
        return SecretsAnswer(values=sealer.open(query.job_id, sealed))
    except Unreadable as exc:  # another replica may hold the key: asked again (said here, and to the node)
        log.error("the secrets of job %s cannot be opened: %s", query.job_id, exc)
        return SecretsAnswer(error=str(exc), final=False)
