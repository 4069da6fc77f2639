"""A rented node's agent trades the bus identity its node was started with for one of a key it made itself.

The start identity travelled where others can read it: an EC2 instance's user data (any principal allowed
`ec2:DescribeInstanceAttribute` reads it for as long as the instance lives, and a read-only role is allowed it), a
Kubernetes Secret, placement's own files. With it anyone could speak for the node (its tasks' ends, its prices) and
read its commands for the node's whole life (not its tasks' secrets: only the key the agent makes asks for those).
So the agent makes a key of its own at its first start (kept, 0600, until the trade is done: asked again after a
lost answer or a restart, it is the same key, and the minter signs the same identity again), asks the minter to sign
it for its node (`shared.minting.RekeyAgent`), writes the new `.creds` over its own copy, reconnects as it, and says
so (`RekeyConfirmed`): the minter revokes the start identity then, though never before `REKEY_HOLD_S` after the
node's mint (or `REKEY_REVOKE_AFTER_S` after a trade never confirmed). From then on what the user data holds is
worthless. A start identity traded twice for different keys within the hold means someone else holds it: the minter
revokes the node, and the agent refused so stops. A thief who traded first and confirmed is caught so when the agent
trades in its turn, within the hold.

The agent connects with its own copy of the start `.creds` (`own_creds`, in its data directory): the file it was
given may be read-only (a Secret's mount), and a restarted agent must find the identity it made, not the revoked
one. Whether the trade was done is what the two files say (the copy's key is no longer the given one's)."""

import asyncio
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import nats
from nats.errors import Error as NatsError
from pydantic import BaseModel, ValidationError

from shared.buscreds import creds_text, decode_claims, new_seed, public_key, write_secret
from shared.minting import REKEY_AGENT, REKEY_INBOX, REKEYED_AGENT, MinterAnswer, RekeyAgent, RekeyConfirmed
from shared.storage import check_segment
from services.agent.isolation import private_dir
from services.agent.preparation import PrepareError

log = logging.getLogger(__name__)

RECONNECT_WAIT_S = 10.0  # how long the agent waits to be connected again as its own key
FIRST_PAUSE_S, LONGEST_PAUSE_S = 2.0, 60.0  # between tries while the minter does not answer, or fails
ASK_TIMEOUT_S = 15.0


class RekeyRefused(Exception):
    """The minter refused (its reason); `final`: asking again will not change it; `revoked`: the node's identity is
    gone, or goes now (someone else traded its start identity)."""

    def __init__(self, reason: str, *, final: bool, revoked: bool = False) -> None:
        super().__init__(reason)
        self.final, self.revoked = final, revoked


def own_creds(given: Path, *, data_dir: Path, node_id: str) -> Path:
    """The agent's own copy of its bus credentials (0600, in its 0700 folder of the data directory): the given file's
    text at the first start, the key it made itself after a trade (never overwritten by the given one again)."""
    own = private_dir(private_dir(data_dir / "agents") / check_segment(node_id)) / "bus.creds"
    if not own.exists():
        write_secret(own, given.read_text())
    return own


def creds_user(creds: Path) -> str:
    """The public key a `.creds` file's JWT names."""
    token = creds.read_text().split("USER JWT-----\n", 1)[1].split("\n", 1)[0]
    return str(decode_claims(token).get("sub", ""))


def traded(own: Path, given: Path) -> bool:
    """Whether the agent's copy holds a key of its own (not the given file's, or that one gone)."""
    try:
        start = creds_user(given)
    except (OSError, IndexError, ValueError):
        return True
    return creds_user(own) != start


def pending_seed(creds: Path) -> str:
    """The seed of the key this agent trades for: made once, kept (0600) until the trade is written."""
    path = creds.with_name(f"{creds.name}.next")
    if path.exists():
        return path.read_text().strip()
    seed = new_seed("user")
    write_secret(path, f"{seed}\n", private_folder=False)
    return seed


async def ask(client: nats.NATS, subject: str, request: BaseModel, *, node_id: str) -> MinterAnswer:
    """The minter's answer, read in the space kept for this node's answers (the only agents' space it may write)."""
    inbox = f"{REKEY_INBOX.format(node_id=node_id)}.{secrets.token_hex(8)}"
    subscription = await client.subscribe(inbox, max_msgs=1)
    try:
        await client.publish(subject, request.model_dump_json().encode(), reply=inbox)
        reply = await subscription.next_msg(timeout=ASK_TIMEOUT_S)
    finally:
        with suppress(NatsError):
            await subscription.unsubscribe()
    answer = MinterAnswer.model_validate_json(reply.data)
    if answer.error:
        raise RekeyRefused(answer.error, final=answer.final, revoked=answer.revoked)
    return answer


async def trade(client: nats.NATS, *, node_id: str, creds: Path) -> str:
    """Have the pending key signed for this node, write it as `creds`, reconnect as it; its public key."""
    seed = pending_seed(creds)
    user = public_key(seed)
    answer = await ask(
        client, REKEY_AGENT.format(node_id=node_id), RekeyAgent(node_id=node_id, user=user), node_id=node_id
    )
    if answer.user != user or decode_claims(answer.jwt).get("sub") != user:  # not the minter's answer to this ask
        raise RekeyRefused("an answer for another key", final=False)
    write_secret(creds, creds_text(jwt=answer.jwt, seed=seed))
    creds.with_name(f"{creds.name}.next").unlink(missing_ok=True)
    await client.force_reconnect()  # reads the file again: the new identity from this connection on
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while not client.is_connected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return user


class Keying:
    """Whether the agent holds its own key yet: only that identity may ask for its tasks' secrets (the start
    identity may not, `busroles.agent`), so a start with secrets waits for the trade, and fails once the minter
    refused it for good."""

    def __init__(self) -> None:
        self.done = False
        self.refused: str | None = None

    def check(self) -> str | None:
        """None once the agent holds its own key; why not yet while the trade is under way (PrepareError raised
        where it never will)."""
        if self.done:
            return None
        if self.refused is not None:
            raise PrepareError(
                f"secrets: this node's agent holds only the identity it was started with, which may not ask for "
                f"them (the minter refused its own key: {self.refused})"
            )
        return "this node's agent has not traded the identity it was started with yet"


async def keep_own_key(
    client: nats.NATS,
    *,
    node_id: str,
    creds: Path,
    given: Path,
    keyed: Callable[[Path], None] = lambda _: None,
    stop: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGTERM),
    keying: Keying | None = None,
) -> None:
    """Trade the start identity (where not done yet), then say the agent is connected as its own key; asked again
    while the minter does not answer or fails. `keyed`: told the new `.creds` once written; `keying`: told when the
    agent holds its own key, or never will. A node whose start identity someone else traded first stops the agent
    (`stop`): the minter revoked the node."""
    keying = keying or Keying()
    pause, reconnected = FIRST_PAUSE_S, False
    while True:
        try:
            if not traded(creds, given):
                user = await trade(client, node_id=node_id, creds=creds)
                keyed(creds)
                log.info("node %s holds a key its agent made (%s)", node_id, user)
            keying.done = True
            await ask(client, REKEYED_AGENT.format(node_id=node_id), RekeyConfirmed(node_id=node_id), node_id=node_id)
            log.info("node %s's start identity is revoked: what its user data or Secret holds is worthless", node_id)
            return
        except RekeyRefused as exc:
            if exc.revoked:
                log.critical("node %s's identity is revoked (%s): this agent stops", node_id, exc)
                stop()
                return
            if exc.final:
                log.error("the minter refused this agent's own key (%s): it keeps its start identity", exc)
                if not keying.done:
                    keying.refused = str(exc)
                return
            log.warning("the minter could not sign this agent's own key yet (%s): asked again in %g s", exc, pause)
        except (NatsError, TimeoutError, OSError, ValidationError) as exc:
            if client.is_closed:  # for good (its identity revoked): the process ends with it
                return
            if traded(creds, given) and client.is_connected and not reconnected:
                # its confirmation unheard: it may still be connected as its start identity, which may not say so
                # (a reconnect was under way when it traded, and force_reconnect does nothing then); once
                await client.force_reconnect()
                reconnected = True
            log.warning("asking the minter to sign this agent's own key failed (%r): asked again in %g s", exc, pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)
