"""Leader leases on the bus: of two replicas of a service that must act once, one leads and the other waits.

A lease is one key of the `tm_leaders` bucket (a JetStream stream in the key-value layout, so `nats kv` reads it),
one key per service. It is taken by writing the key only if it has no value (`Nats-Expected-Last-Subject-Sequence:
0`) and kept by rewriting it on the revision last written; the bucket forgets a value `LEASE_TTL_S` after it was
written, so a leader that dies (or loses the bus) loses its lease that long after its last renewal, and a waiting
replica takes it then. The revision that took the lease is its epoch: every leader has a larger one than the last.

A leader acts only while its lease is certainly its own: until `LEASE_TTL_S - MARGIN_S` after the moment it sent
its last successful renewal (the server wrote it later, and forgets it `LEASE_TTL_S` after that). Past that, or
when a renewal finds the key rewritten by another, the lease is lost and the process must stop acting at once
(`shared.service` exits it; a supervisor starts it again, as a replica that waits). What this cannot fence: a
process frozen (stopped, swapped out) between checking its lease and a write for longer than the margin.

Anyone who may ask the JetStream API something (an agent reading its commands) can name the key's subject as the
reply subject, and the server writes its answer there: a value that is no lease. The leader writes over it (no
acquirer can have taken a key that held a value all along); a replica waiting to lead waits until it is forgotten.
"""

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from shared.bus import LEASE_BUCKET, LEASE_TTL_S, LEASES

log = logging.getLogger(__name__)

RENEW_S = 1.0
MARGIN_S = 2.0  # a leader stops this long before its lease could have run out
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code: the key was written since (another holds the lease)


class LeaseLost(RuntimeError):
    """The lease was taken by another replica, or could not be renewed in time: stop acting now."""


def holder_id() -> str:
    """host:pid:token — the token tells two leases of one process apart (a write of ours is recognised by it)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Lease:
    """One service's lease, as seen by one replica: `acquire` waits until it leads, `keep` renews until lost."""

    def __init__(
        self,
        js: JetStreamContext,
        role: str,
        *,
        holder: str | None = None,
        ttl_s: float = LEASE_TTL_S,
        renew_s: float = RENEW_S,
        margin_s: float = MARGIN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < renew_s < ttl_s - margin_s:
            raise ValueError("a lease must be renewed well within its time to live less the margin")
        self.js, self.role, self.holder = js, role, holder or holder_id()
        self.subject = f"$KV.{LEASE_BUCKET}.{role}"
        self.ttl_s, self.renew_s, self.margin_s, self.clock = ttl_s, renew_s, margin_s, clock
        self.epoch = self.revision = 0
        self.valid_until = 0.0

    def held(self) -> bool:
        """Whether this replica may act now."""
        return self.epoch > 0 and self.clock() < self.valid_until

    async def acquire(self, *, poll_s: float = 0.5) -> int:
        """Wait until this replica holds the lease; returns its epoch."""
        while True:
            sent = self.clock()
            revision = None
            try:
                revision = await self._write(last=0, timeout_s=max(poll_s, 1.0))
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    revision = await self._own_last_write()  # None: another holds it
                else:
                    log.warning("lease %s: %r", self.role, exc)
            except (NatsError, TimeoutError) as exc:
                log.warning("lease %s: the bus did not answer: %r", self.role, exc)
            if revision is not None:  # taken now, or by a write of ours whose acknowledgement was lost
                self.epoch = self.revision = revision
                self.valid_until = sent + self.ttl_s - self.margin_s
                return revision
            await asyncio.sleep(poll_s)

    async def keep(self) -> None:
        """Renew the lease every `renew_s` for as long as it is held; raises LeaseLost when it is not."""
        while True:
            await asyncio.sleep(self.renew_s)
            left = self.valid_until - self.clock()
            if left <= 0:
                raise LeaseLost(f"{self.role}: not renewed within {self.ttl_s - self.margin_s:g} s")
            sent = self.clock()
            try:
                self.revision = await self._write(last=self.revision, timeout_s=left)
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    log.warning("lease %s: renewal refused: %r", self.role, exc)
                    continue
                try:
                    self.revision = await self._after_conflict(timeout_s=left)
                except APIError as again:  # rewritten again meanwhile: looked at next round, while still valid
                    log.warning("lease %s: renewal over a stray message refused: %r", self.role, again)
                    continue
                except (NatsError, TimeoutError) as again:
                    log.warning("lease %s: renewal over a stray message not answered: %r", self.role, again)
                    continue
                self.valid_until = sent + self.ttl_s - self.margin_s
            except (NatsError, TimeoutError) as exc:
                log.warning("lease %s: renewal not answered: %r", self.role, exc)
            else:
                self.valid_until = sent + self.ttl_s - self.margin_s

    async def _after_conflict(self, *, timeout_s: float) -> int:
        """The key was written since our last renewal. By us (a lost acknowledgement): its revision. By something
        that is no lease at all (a JetStream API answer someone aimed at this subject as its reply subject): written
        over, for no acquirer can have taken a key that holds a value. By another holder: LeaseLost."""
        last = await self._last()
        if last is None:
            raise LeaseLost(f"{self.role}: the lease of epoch {self.epoch} cannot be read back")
        seq, value = last
        left = min(timeout_s, self.valid_until - self.clock())
        if value is None and left > 0:  # the stray outlives our last value: nobody took the key meanwhile
            log.warning("lease %s: a stray message (not a lease) replaced ours; written over", self.role)
            return await self._write(last=seq, timeout_s=left)
        if value is None:
            raise LeaseLost(f"{self.role}: not renewed within {self.ttl_s - self.margin_s:g} s")
        if value.get("holder") == self.holder and value.get("epoch") == (self.epoch or None):
            return seq
        raise LeaseLost(f"{self.role}: the lease of epoch {self.epoch} was taken by another")

    async def _last(self) -> tuple[int, dict | None] | None:
        """The key's last revision and its lease (None: a value that is no lease); None when it cannot be read."""
        try:
            last = await self.js.get_last_msg(LEASES.name, self.subject, direct=True)
        except (NatsError, TimeoutError):
            return None
        if last.seq is None:
            return None
        try:
            value = json.loads(last.data or b"")
        except ValueError:
            return last.seq, None
        is_lease = isinstance(value, dict) and set(value) == {"holder", "epoch"} and isinstance(value["holder"], str)
        return last.seq, value if is_lease else None

    async def _own_last_write(self) -> int | None:
        """The key's revision if its last value is this replica's own (with this epoch): a write of ours that the
        server took though its acknowledgement never came back. None when another wrote it (or it cannot be read)."""
        last = await self._last()
        if last is None:
            return None
        seq, value = last
        if value is None or value.get("holder") != self.holder or value.get("epoch") != (self.epoch or None):
            return None
        return seq

    async def _write(self, *, last: int, timeout_s: float) -> int:
        payload = json.dumps({"holder": self.holder, "epoch": self.epoch or None}).encode()
        ack = await asyncio.wait_for(
            self.js.publish(
                self.subject,
                payload,
                stream=LEASES.name,
                timeout=timeout_s,
                headers={"Nats-Expected-Last-Subject-Sequence": str(last)},
            ),
            timeout=timeout_s,
        )
        return ack.seq
