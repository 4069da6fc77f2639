"""Providers per catalogue entry, and the loop that keeps the cloud and the node records in step: nothing rented
is forgotten (an orphan is given back and billed from its launch to now), and types the cloud refused rest."""

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from shared.clock import utcnow
from shared.events import NodeProvisioned, NodeReleased
from shared.store import DocumentStore
from services.placement.policy import InstanceType
from services.placement.providers.base import Orphan, Provider
from services.placement.providers.cloud import OfferInfo

if TYPE_CHECKING:  # the fleet keeps its providers: imported for its type only
    from services.placement.fleet import Fleet

log = logging.getLogger(__name__)


class Providers:
    """The provider interface over several providers: each catalogue entry names the one that rents it."""

    def __init__(
        self,
        by_name: dict[str, Provider],
        offers: dict[str, OfferInfo],
        instance_of: Callable[[str], str | None] = lambda node_id: None,
    ) -> None:
        self.by_name = by_name
        self.offers = offers
        self.instance_of = instance_of
        self.job_of: Callable[[str], str | None] = lambda node_id: None
        self.leaving: dict[str, float] = {}  # interrupted node -> when it is released at the latest
        self.name = "+".join(sorted(by_name))

    def of(self, instance_name: str | None) -> Provider | None:
        offer = self.offers.get(instance_name or "")
        return self.by_name.get(offer.provider if offer else "local-process")

    async def provision(self, node_id: str, instance: InstanceType) -> int | None:
        provider = self.of(instance.name)
        if provider is None:
            raise RuntimeError(f"no provider configured for {instance.name} ({self.offers.get(instance.name)})")
        return await provider.provision(node_id, instance)

    async def release(self, node_id: str, handle: int | None) -> None:
        """By the node's instance type; when that is unknown, every provider (each ignores nodes not its own)."""
        provider = self.of(self.instance_of(node_id))
        for p in [provider] if provider else list(self.by_name.values()):
            await p.release(node_id, handle)

    def available(self, instance_name: str) -> bool:
        provider = self.of(instance_name)
        check = getattr(provider, "available", None)
        return check(instance_name) if check else True

    def reconcilers(self) -> list:
        return [p for p in self.by_name.values() if hasattr(p, "reconcile")]

    def watchers(self) -> list:
        """Providers that report a node's end as it happens (Kubernetes' Pod watch)."""
        return [p for p in self.by_name.values() if hasattr(p, "watch")]


async def record_orphans(
    store: DocumentStore,
    orphans: list[Orphan],
    *,
    catalogue: dict[str, InstanceType],
    provider: str,
    now: datetime | None = None,
) -> int:
    """Bill orphans no record ever knew (a crash between renting and recording) from launch to now."""
    recorded = 0
    for orphan in orphans:
        node_id = orphan.node_id or f"orphan-{orphan.instance_id}"
        if await store.load(node_id):
            continue  # a record saw it (and billing with it); it was released, the cloud was slow to forget
        known = catalogue.get(orphan.instance_type)
        events = [
            NodeProvisioned(
                event_id=f"{node_id}:provisioned",
                node_id=node_id,
                instance_type=orphan.instance_type or "unknown",
                provider=provider,
                price_per_hour=known.price_per_hour if known else 0.0,
                gpu_count=known.gpus if known else 0,
                provisioned_at=orphan.launched_at,
                for_job_id=orphan.job_id,
            ),
            NodeReleased(event_id=f"{node_id}:released", node_id=node_id, released_at=now or utcnow(), reason="orphan"),
        ]
        doc = {"node_id": node_id, "state": "released", "provisioned": True, "instance_type": orphan.instance_type}
        if await store.save(node_id, doc, None, events):
            recorded += 1
    return recorded


INTERRUPTED_GRACE_S = 30.0  # the agent's snapshot, its tasks' ends reported, before its identity is revoked


async def node_interrupted(fleet: "Fleet", node_id: str, *, grace_s: float = INTERRUPTED_GRACE_S) -> bool:
    """A spot node's notice: it gets no more work now (placement's view: lost) and is released once its agent
    had time to snapshot and report, or sooner when the monitor finds it gone."""
    node = fleet.nodes.get(node_id)
    if node is None or not node.provisioned or node.state != "ready":
        return False
    leaving = getattr(fleet.provider, "leaving", None)
    if leaving is not None:
        leaving[node_id] = time.time() + grace_s
    # not kept for its job either: a job whose node is kept for it waits for that node (policy/engine.py)
    await fleet._save(node.model_copy(update={"state": "lost", "reserved_for": None}), [])
    log.warning("node %s is being taken back by its cloud: no more work there", node_id)
    return True


async def pod_failed(fleet: "Fleet", node_id: str, reason: str) -> bool:
    """Its Pod failed, ended or is being deleted (a watch saw it, no heartbeat timeout waited for): a node that never
    registered is given back now; a registered one gets no more work now and is released as an interrupted node is
    (the monitor finds it silent and requeues what ran there)."""
    node = fleet.nodes.get(node_id)
    if node is None or not node.provisioned:
        return False
    if node.state == "provisioning":
        return await fleet.release(node_id, reason=reason)
    return await node_interrupted(fleet, node_id)


async def release_lost(fleet: "Fleet", providers: Providers, now: float | None = None) -> list[str]:
    """Rented nodes placement no longer uses but still pays for (lost, interrupted, a release that failed)."""
    now = time.time() if now is None else now
    released = []
    for node in list(fleet.nodes.values()):
        if node.provisioned and node.state == "lost" and providers.leaving.get(node.node_id, 0.0) <= now:
            if await fleet.release(node.node_id, reason="lost"):
                released.append(node.node_id)
            providers.leaving.pop(node.node_id, None)
    return released


async def reconcile_once(*, fleet: "Fleet", providers: Providers) -> int:
    """One round: give back orphans, hide types the cloud refused (placement rents the next one instead). Hidden
    from what placement rents only: the catalogue was narrowed before, and a node of a hidden type already rented
    then had no record (its next registration refused, its spot market forgotten) until the type came back."""
    fleet.cloud_refused = frozenset(i.name for i in fleet.catalogue if not providers.available(i.name))
    await release_lost(fleet, providers)
    owned = {n.node_id for n in fleet.nodes.values() if n.state != "released"}
    known = {i.name: i for i in fleet.catalogue}
    found = 0
    for provider in providers.reconcilers():
        orphans = await provider.reconcile(owned)
        found += len(orphans)
        await record_orphans(fleet.store, orphans, catalogue=known, provider=provider.name)
    return found


async def reconcile_loop(*, fleet: "Fleet", providers: Providers, interval_s: float) -> None:
    while True:
        try:
            await reconcile_once(fleet=fleet, providers=providers)
        except Exception as exc:  # the cloud API unreachable: the next round tries again
            log.warning("reconciling rented nodes failed: %r", exc)
        await asyncio.sleep(interval_s)
