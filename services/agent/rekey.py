"""A rented node's agent trades the bus identity its node was started with for one of a key it made itself.

The start identity travelled where others can read it: an EC2 instance's user data (any principal allowed
`ec2:DescribeInstanceAttribute` reads it for as long as the instance lives, and a read-only role is allowed it), a
Kubernetes Secret, placement's own files. With it anyone could speak for the node (its tasks' ends, its prices)
and read its commands (job secrets included) for the node's whole life. So the agent makes a key of its own at its
first start, asks the minter once to sign it for its node (`shared.minting.RekeyAgent`), writes the new `.creds`
over its own copy and reconnects as it; the minter revokes the start identity `REKEY_REVOKE_AFTER_S` later. From
then on what the user data holds is worthless. Whoever asks first holds the node's identity: an agent refused
because its node was rekeyed already says so and stops (someone else speaks for its node).

The agent connects with its own copy of the start `.creds` (`own_creds`, in its data directory): the file it was
given may be read-only (a Secret's mount), and a restarted agent must find the identity it made, not the revoked
one."""

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import nats
from nats.errors import Error as NatsError

from shared.buscreds import creds_text, decode_claims, new_seed, public_key, write_secret
from shared.minting import REKEY_AGENT, MinterAnswer, RekeyAgent
from shared.storage import check_segment
from services.agent.isolation import private_dir

log = logging.getLogger(__name__)

RECONNECT_WAIT_S = 10.0  # how long the agent waits to be connected again as its own key
FIRST_PAUSE_S, LONGEST_PAUSE_S = 2.0, 60.0  # between tries while the minter does not answer
ASK_TIMEOUT_S = 10.0


class RekeyRefused(Exception):
    """The minter refused to sign the agent's own key (its reason)."""


def own_creds(given: Path, *, data_dir: Path, node_id: str) -> Path:
    """The agent's own copy of its bus credentials (0600, in its 0700 folder of the data directory): the given file's
    text at the first start, the key it made itself after a rekey (never overwritten by the given one again)."""
    own = private_dir(private_dir(data_dir / "agents") / check_segment(node_id)) / "bus.creds"
    if not own.exists():
        write_secret(own, given.read_text())
    return own


def rekeyed_marker(creds: Path) -> Path:
    return creds.with_name(f"{creds.name}.rekeyed")


async def rekey(client: nats.NATS, *, node_id: str, creds: Path) -> str:
    """Ask the minter to sign a new key for this node; write it as `creds`; reconnect as it. Its public key."""
    seed = new_seed("user")
    user = public_key(seed)
    request = RekeyAgent(node_id=node_id, user=user)
    reply = await client.request(
        REKEY_AGENT.format(node_id=node_id), request.model_dump_json().encode(), timeout=ASK_TIMEOUT_S
    )
    answer = MinterAnswer.model_validate_json(reply.data)
    if answer.error:
        raise RekeyRefused(answer.error)
    if decode_claims(answer.jwt).get("sub") != user:
        raise RekeyRefused("the minter's answer is not for the key this agent made")
    write_secret(creds, creds_text(jwt=answer.jwt, seed=seed))
    rekeyed_marker(creds).write_text(f"{user}\n")
    await client.force_reconnect()  # reads the file again: the new identity from this connection on
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while not client.is_connected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return user


async def keep_own_key(
    connection: Callable[[], nats.NATS],
    *,
    node_id: str,
    creds: Path,
    stop: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGTERM),
) -> None:
    """Rekey once (nothing where the marker says it was done), asking again while the minter does not answer; a
    node rekeyed by someone else first stops the agent (`stop`)."""
    if rekeyed_marker(creds).exists():
        return
    pause = FIRST_PAUSE_S
    while True:
        try:
            user = await rekey(connection(), node_id=node_id, creds=creds)
        except RekeyRefused as exc:
            if "own key already" in str(exc):
                log.critical("another holds node %s's identity (%s): this agent stops", node_id, exc)
                stop()
            else:
                log.error("the minter did not sign this agent's own key (%s): it keeps its start identity", exc)
            return
        except (NatsError, TimeoutError, OSError) as exc:
            log.warning("asking the minter to sign this agent's own key failed (%r): asked again in %g s", exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)
            continue
        log.info(
            "node %s speaks with a key of its own agent's now (%s); its start identity is revoked shortly",
            node_id,
            user,
        )
        return
