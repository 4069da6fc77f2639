"""Submitter subscribers: keep the API's view of jobs current, store their output."""

import logging
import time
from typing import Any

from faststream.exceptions import NackMessage
from faststream.nats import NatsRouter
from pydantic import ValidationError

from shared.bus import RPC_SECRETS, durable, retry_transient
from shared.clock import utcnow
from shared.context import Context, NatsMessage
from shared.events import ALL_STATUSES, EtaEstimated, JobPlaced, JobStatusChanged, LogChunk, Notification
from shared.handlers import HandlerTable, dispatch
from shared.jobsecrets import SecretsAnswer, SecretsQuery, reply_space
from shared.origin import deliveries, placements_consumer
from services.submitter import secrets
from services.submitter.logs import output_stored
from services.submitter.repository import Repository
from services.submitter.sealing import Sealer

log = logging.getLogger(__name__)

OUTPUT_RETRY_S = 0.2  # a finished status whose output is not all stored is looked at again this soon, then as
OUTPUT_RETRY_MAX_S = 3.2  # long again as it is old, up to this: 9 looks in the 15 s hold (each a count), not 75


def output_retry_s(age_s: float) -> float:
    """How long a status waiting for its output waits, `age_s` after it occurred: judged by its age, as the hold is,
    not by its deliveries (a redelivery for a database blip, or after a restart, is no wait for output)."""
    return min(OUTPUT_RETRY_S + max(age_s, 0.0), OUTPUT_RETRY_MAX_S)


async def status_changed(repo: Repository, event: JobStatusChanged) -> None:
    """Project the monitor's status onto the job the API shows; a finished one once its final output is stored
    (until then it comes back: `output_retry_s`)."""
    now = utcnow()
    if not await output_stored(repo, event, now=now):
        raise NackMessage(delay=output_retry_s((now - event.occurred_at).total_seconds()))
    await repo.apply_status(event)


async def placed(repo: Repository, event: JobPlaced) -> None:
    """Which node runs each rank of the attempt: the only node whose output of it is taken."""
    if repo.origins is not None:
        await repo.origins.placed(event)


async def output(repo: Repository, chunk: LogChunk) -> None:
    """Keep a chunk of output once (past the job's cap, its oldest chunks go)."""
    await repo.output.add(chunk)


async def notified(repo: Repository, event: Notification) -> None:
    """Keep it for delivery to the project's webhook (delivery runs apart, with retries)."""
    await repo.notifications.record(event)


# Keep output for the logs endpoint; show the latest remaining-time estimate on the job.
EVENT_HANDLERS: HandlerTable[Repository] = {
    JobStatusChanged: status_changed,
    JobPlaced: placed,
    LogChunk: output,
    EtaEstimated: Repository.apply_eta,
    Notification: notified,
}

router = NatsRouter()
# Placements, a batch at once (their records in one write), only to tell each chunk of output from its task's own
# node from anyone else's.
PLACED = placements_consumer("submitter-placed")


@router.subscriber(
    **durable("tm.job.status.>", consumer="submitter-status", batch=64, ordered=False, only=ALL_STATUSES)
)
@retry_transient
async def on_status(event: JobStatusChanged, repo: Repository = Context("repo")) -> None:
    """Jobs' status changes."""
    await dispatch(EVENT_HANDLERS, event, repo)


@router.subscriber(**PLACED)
@retry_transient
async def on_placed(event: JobPlaced, repo: Repository = Context("repo")) -> None:
    """Which node runs each rank of each attempt."""
    await dispatch(EVENT_HANDLERS, event, repo)


@router.subscriber(**durable("tm.log.>", consumer="submitter-logs", batch=64, ordered=False))
@retry_transient
async def on_log(chunk: LogChunk, message: NatsMessage, repo: Repository = Context("repo")) -> None:
    """Jobs' output, from the node each task was placed on (anything else is dropped)."""
    origins = repo.origins  # None: no record to check the node against, so nothing is believed
    if origins is not None and await origins.admit(chunk, deliveries=deliveries(message)):
        await dispatch(EVENT_HANDLERS, chunk, repo)


@router.subscriber(**durable("tm.eta.>", consumer="submitter-eta", batch=64, ordered=False))
@retry_transient
async def on_eta(event: EtaEstimated, repo: Repository = Context("repo")) -> None:
    """Jobs' remaining-time estimates."""
    await dispatch(EVENT_HANDLERS, event, repo)


@router.subscriber(**durable("tm.notify.>", consumer="submitter-notify", ordered=False))
@retry_transient
async def on_notification(event: Notification, repo: Repository = Context("repo")) -> None:
    """Notifications for people."""
    await dispatch(EVENT_HANDLERS, event, repo)


SECRETS_PREFIX = RPC_SECRETS.format(node_id="")
SECRETS_AT_ONCE = 16  # requests answered side by side (one waiting on the database holds no other back)
LIMITER = secrets.node_limiter()


@router.subscriber(RPC_SECRETS.format(node_id="*"), queue="submitter-secrets", max_workers=SECRETS_AT_ONCE)
async def on_secrets(
    body: Any, message: NatsMessage, repo: Repository = Context("repo"), sealer: Sealer = Context("sealer")
) -> dict | None:
    """A node's agent asks for the secrets of a task it is to start: the node is the one its subject names (the
    server holds each agent to its own), the answer goes only into that node's space (`jobsecrets.reply_space`),
    from one replica of the submitter (a queue group)."""
    node_id = message.raw_message.subject.removeprefix(SECRETS_PREFIX)
    if not (message.reply_to or "").startswith(reply_space(node_id)):
        log.warning("refused a secrets request from node %s: its reply subject is not the node's own", node_id)
        message.reply_to = ""  # never answered elsewhere (FastStream would publish the result there)
        return None
    if LIMITER.take(node_id, time.monotonic()) > 0:
        return SecretsAnswer(error="too many requests from this node: ask again later", final=False).model_dump()
    try:
        query = SecretsQuery.model_validate(body)
    except ValidationError as exc:
        return SecretsAnswer(
            error=f"not a secrets request: {exc.errors()[0].get('msg', 'invalid')}", final=True
        ).model_dump()
    return (await secrets.answer(repo, query, node_id=node_id, sealer=sealer)).model_dump()
