"""A task's secrets (`shared.jobsecrets`): asked of the submitter when the task starts, kept in memory only, set
in the task's environment and masked in its output."""

import asyncio
import secrets
import time
from collections.abc import Callable, Iterable
from contextlib import suppress

import nats
from nats.errors import Error as NatsError
from pydantic import ValidationError

from shared.bus import RPC_SECRETS
from shared.events import StartTask
from shared.jobsecrets import SecretsAnswer, SecretsQuery, reply_space
from services.agent.preparation import PrepareError

ASK_TIMEOUT_S = 5.0
# A start waits this long (Pending/Preparing) for the submitter (down, restarting, not yet knowing the placement),
# asking again after PAUSE_S, twice as long after each passing refusal up to LONGEST_PAUSE_S; then it fails.
WAIT_S = 3600.0
PAUSE_S, LONGEST_PAUSE_S = 0.5, 15.0
MIN_MASKED = 4  # characters: a shorter value would mask ordinary words of the output
MASK = "***"


async def ask(client: nats.NATS, query: SecretsQuery, *, node_id: str) -> SecretsAnswer:
    """The submitter's answer, read in this node's own space (the only one it may answer agents in)."""
    inbox = f"{reply_space(node_id)}{secrets.token_hex(8)}"
    subscription = await client.subscribe(inbox, max_msgs=1)
    try:
        await client.publish(RPC_SECRETS.format(node_id=node_id), query.model_dump_json().encode(), reply=inbox)
        reply = await subscription.next_msg(timeout=ASK_TIMEOUT_S)
    finally:
        with suppress(NatsError):
            await subscription.unsubscribe()
    return SecretsAnswer.model_validate_json(reply.data)


async def fetch(
    client: Callable[[], nats.NATS],
    start: StartTask,
    *,
    node_id: str,
    wait_s: float = WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    keyed: Callable[[], str | None] | None = None,
) -> dict[str, str]:
    """The task's secrets by name ({} for a job without any); a refusal, or no answer in `wait_s`, is the start's
    failure (`PrepareError`, said why; never a value). `keyed`: whether this agent's identity may ask yet (a rented
    node's, once it holds its own key: `rekey.Keying.check`)."""
    names = start.algorithm.secret_names
    if not names:
        return {}
    query = SecretsQuery(job_id=start.job_id, attempt=start.attempt, rank=start.rank)
    deadline, last, pause = clock() + wait_s, "no answer", PAUSE_S
    while True:
        if keyed is not None and (waiting := keyed()) is not None:
            last = waiting
        else:
            try:
                answer = await ask(client(), query, node_id=node_id)
            except (NatsError, TimeoutError, ValidationError) as exc:
                last = f"no answer from the submitter ({type(exc).__name__})"
            else:
                if answer.error and answer.final:
                    raise PrepareError(f"secrets: the submitter refused them: {answer.error}")
                if not answer.error:
                    if missing := [n for n in names if n not in answer.values]:
                        raise PrepareError(f"secrets: {missing[0]!r} was not given (the job's secrets are gone)")
                    return {n: answer.values[n] for n in names}
                last = answer.error
        if clock() >= deadline:
            raise PrepareError(f"secrets: not given in {wait_s:.0f} s: {last}")
        await asyncio.sleep(pause)
        pause = min(LONGEST_PAUSE_S, pause * 2)


class Masker:
    """Replaces a task's secret values in text it prints (each line of a value on many lines too)."""

    def __init__(self, values: Iterable[str]) -> None:
        parts = {p for v in values for p in (v, *v.splitlines()) if len(p) >= MIN_MASKED}
        self.values = sorted(parts, key=len, reverse=True)  # the longest first: a value within another is no hint

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def encoded(self) -> tuple[bytes, ...]:
        """What it masks, as the task's output bytes hold it (the longest first)."""
        return tuple(v.encode() for v in self.values)

    def __bool__(self) -> bool:
        return bool(self.values)
