"""Commands to the monitor about one job (terminate, migrate): asked over request/reply, or left on the stream."""

import logging

from shared.asking import request
from shared.bus import publish
from shared.events import JobStatusChanged
from services.submitter.repository import Repository

log = logging.getLogger(__name__)


async def send_command(broker, repository: Repository, command, subject: str) -> None:
    """Ask the monitor to act; when it does not answer, the durable command reaches it when it is back."""
    try:
        reply = await request(broker, command, subject, timeout=3)
        body = await reply.decode()
        if body:
            await repository.apply_status(JobStatusChanged.model_validate(body))
        else:  # the monitor has not read the job's submission yet: the durable command comes after it
            await publish(broker, command)
    except Exception as exc:  # the monitor is away: the durable command reaches it when it is back
        log.warning("%s through the stream (monitor did not answer: %r)", command.event_id, exc)
        await publish(broker, command)
