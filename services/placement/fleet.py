"""The nodes placement may use, and the life of the on-demand ones it pays for: provision, use, release."""

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from faststream.nats import NatsBroker
from pydantic import BaseModel, ConfigDict

from shared.asking import request
from shared.bus import RPC_ADMIT
from shared.clock import utcnow
from shared.cluster import parse_cluster
from shared.events import NodeProvisioned, NodeReleased
from shared.noderecords import NodeLimits, admitted, limits_from_entry
from shared.nodes import NodeInfo
from shared.rpc import AdmitQuery, AdmitReply
from shared.store import DocumentStore
from services.placement.adapter import Usage, policy_node, reference_tflops
from services.placement.policy import InstanceType, Node
from services.placement.providers import Provider, node_entry
from services.placement.providers.base import REGISTER_PATIENCE_S
from services.placement.providers.cloud import Cooldown

log = logging.getLogger(__name__)
# A type whose node never registered (an image that cannot start the agent, a node that cannot reach the bus) is not
# rented again for this long: each try was paid for its boot and REGISTER_PATIENCE_S, and was made again at once.
UNBOOTABLE_S = 600.0
ADMIT_TIMEOUT_S = 3
# The random part of a rented node's id: the minter never grants a retired id again, and with 24 bits one rental in
# 330 would have met a retired id near the minter's 50,000-revocation cap; 40 bits keep the longest id (an offer
# name of 48 characters) within a Kubernetes label value's 63.
NODE_ID_RANDOM_HEX = 10


def rented_node_id(instance_name: str) -> str:
    """A fresh id for a node rented as `instance_name`."""
    return f"od-{instance_name.replace('.', '-')}-{uuid.uuid4().hex[:NODE_ID_RANDOM_HEX]}"


def rented_limits(node_id: str, instance: InstanceType) -> NodeLimits:
    """A rented node's record: the cluster-file entry its agent is started with (`node_entry`)."""
    return limits_from_entry(parse_cluster(node_entry(node_id, instance)).nodes[0])


class FleetNode(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    info: NodeInfo | None = None
    state: Literal["provisioning", "ready", "lost", "released"] = "ready"
    provisioned: bool = False  # by us: ours to release
    instance_type: str | None = None
    ready_at: float | None = None
    handle: int | None = None
    reserved_for: str | None = None
    release_when_idle: bool = False
    claims_refused: dict[str, str] = {}  # what its last registration claimed beyond its record (noderecords)


@dataclass
class Fleet:
    store: DocumentStore
    provider: Provider
    catalogue: tuple[InstanceType, ...] = ()
    nodes: dict[str, FleetNode] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # jobs whose on-demand node the budget refused
    held: set[str] = field(default_factory=set)  # rented nodes not yet released
    unbootable: Cooldown = field(default_factory=lambda: Cooldown(UNBOOTABLE_S))  # types whose node never registered
    cloud_refused: frozenset[str] = frozenset()  # types the cloud refused lately (`reconcile_once` says which)
    # The static nodes' records (the cluster file's [[nodes]]); None: registrations are taken as said (in-memory
    # tests only: the service always has them).
    static: dict[str, NodeLimits] | None = None
    # Each node's policy view, kept with what it was built from: a pass or a dry run over 10,000 nodes rebuilds
    # only the nodes whose record, capacity given out or idle clock changed (records are replaced, never mutated).
    _views: dict[str, tuple[FleetNode, tuple, Node]] = field(default_factory=dict, repr=False)
    _empty: dict[str, tuple[NodeInfo, Node]] = field(default_factory=dict, repr=False)
    _reference: tuple[list[NodeInfo], float] | None = field(default=None, repr=False)

    @property
    def broker(self) -> NatsBroker:
        return self.store.broker

    def info(self, node_id: str) -> NodeInfo:
        """What a registered node said of itself (KeyError: no such node, or a rented one still booting)."""
        node = self.nodes.get(node_id)
        if node is None or node.info is None:
            raise KeyError(f"node {node_id} has not registered")
        return node.info

    def registration(self, node_id: str) -> NodeInfo | None:
        """What the node said of itself, if it is known and has registered."""
        node = self.nodes.get(node_id)
        return node.info if node else None

    async def load(self) -> None:
        async for doc in self.store.collection.find({"state": {"$ne": "released"}}):
            node = FleetNode.model_validate(doc)
            self.nodes[node.node_id] = node
            self._track(node)

    def policy_nodes(self, usage: Mapping[str, Usage]) -> tuple[Node, ...]:
        """Nodes that can take work now, or will once booted, as the policy sees them (`usage`: capacity given out)."""
        return tuple(
            self._view(n, usage.get(n.node_id))
            for n in self.nodes.values()
            if n.info and n.state in ("ready", "provisioning")
        )

    def _view(self, node: FleetNode, used: Usage | None) -> Node:
        built_from = (
            None if used is None else (frozenset(used.gpus), used.cpu, used.memory_gb),
            self.idle_since.get(node.node_id),
        )
        hit = self._views.get(node.node_id)
        if hit is not None and hit[0] is node and hit[1] == built_from:
            return hit[2]
        if node.info is None:
            raise ValueError(f"node {node.node_id} has not registered: it has no policy view")
        view = policy_node(
            node.info,
            used,
            ready_at=node.ready_at,
            reserved_for=node.reserved_for,
            idle_since=built_from[1],
            instance_type=node.instance_type,
            spot=any(i.spot for i in self.catalogue if i.name == node.instance_type),
        )
        self._views[node.node_id] = (node, built_from, view)
        return view

    def known_nodes(self) -> tuple[Node, ...]:
        """Every node not given back, lost ones included (they may come back), as empty policy nodes."""
        return tuple(self._empty_view(info) for info in self.all_infos())

    def _empty_view(self, info: NodeInfo) -> Node:
        hit = self._empty.get(info.node_id)
        if hit is None or hit[0] is not info:
            hit = self._empty[info.node_id] = (info, policy_node(info))
        return hit[1]

    def reference_tflops(self) -> float:
        """The fleet's median GPU speed (`adapter.reference_tflops`), recomputed only when a node record changed."""
        infos = self.all_infos()
        if self._reference is None or self._reference[0] != infos:  # identity first: a changed node is a new record
            self._reference = (infos, reference_tflops(infos))
        return self._reference[1]

    def rented(self) -> bool:
        """Whether any node we rent is still held (then a pass may release or pull back from it); O(1)."""
        return bool(self.held)

    def _track(self, node: FleetNode) -> None:
        if node.provisioned and node.state != "released":
            self.held.add(node.node_id)
        else:
            self.held.discard(node.node_id)

    def ready_infos(self) -> list[NodeInfo]:
        return [n.info for n in self.nodes.values() if n.info and n.state == "ready"]

    def all_infos(self) -> list[NodeInfo]:
        return [n.info for n in self.nodes.values() if n.info and n.state != "released"]

    def limits(self, node_id: str) -> NodeLimits | None:
        """What the node may offer: a rented node's record is the entry its agent was started with (its instance
        type), a static node's the cluster file's; None when there is neither."""
        node = self.nodes.get(node_id)
        if node is not None and node.provisioned:
            instance = next((i for i in self.catalogue if i.name == node.instance_type), None)
            return rented_limits(node_id, instance) if instance else None
        return (self.static or {}).get(node_id)

    async def registered(self, claimed: NodeInfo) -> bool:
        """A node's registration, capped to its record (refused without one); returns whether anything changed."""
        if self.static is None:
            return await self.seen(claimed.node_id, info=claimed, state="ready")
        info, refused = admitted(claimed, self.limits(claimed.node_id))
        if info is None:
            return False
        return await self.seen(claimed.node_id, info=info, state="ready", refused=refused)

    async def seen(
        self,
        node_id: str,
        *,
        info: NodeInfo | None,
        state: Literal["ready", "lost"],
        refused: dict[str, str] | None = None,
    ) -> bool:
        """A registration or a liveness verdict; returns whether anything changed."""
        current = self.nodes.get(node_id)
        if current and current.state == "released":
            return False
        update = {"state": state, **({"info": info, "claims_refused": refused or {}} if info else {})}
        node = (current or FleetNode(node_id=node_id)).model_copy(update=update)
        if node == current or node.info is None:
            return False
        await self._save(node, [])
        if state == "lost" and node.provisioned:  # a lost rented node is still billed: give it back
            await self.release(node_id, reason="lost")
        return True

    def update_idle(self, busy: set[str], now: float) -> None:
        """Start the idle clock of on-demand nodes that have just emptied (it runs until a job lands)."""
        for node in self.nodes.values():
            if node.info and node.info.kind == "on_demand" and node.node_id not in busy:
                self.idle_since.setdefault(node.node_id, now)
            else:
                self.idle_since.pop(node.node_id, None)

    def live(self) -> list[FleetNode]:
        """Nodes that are, or are becoming, usable: the only ones whose reservation keeps anything."""
        return [n for n in self.nodes.values() if n.state in ("provisioning", "ready")]

    async def claimed(self, node_id: str) -> None:
        """A job started on the node: it is no longer kept for the job it was made or reserved for."""
        node = self.nodes.get(node_id)
        if node and node.reserved_for:
            await self._save(node.model_copy(update={"reserved_for": None}), [])

    async def reserve(self, node_id: str, job_id: str) -> None:
        node = self.nodes.get(node_id)
        if node:
            await self._save(node.model_copy(update={"reserved_for": job_id}), [])

    async def release_when_idle(self, node_id: str) -> None:
        node = self.nodes.get(node_id)
        if node and node.provisioned:
            await self._save(node.model_copy(update={"release_when_idle": True}), [])

    async def provision(
        self, instance_name: str, count: int, *, job_id: str, project_id: str, user_name: str, expected_hours: float
    ) -> list[str]:
        """Create on-demand nodes for a job, if billing admits the spend; return their ids."""
        instance = next((i for i in self.catalogue if i.name == instance_name), None)
        if instance is None:
            log.error("instance type %s is not in the catalogue", instance_name)
            return []
        query = AdmitQuery(
            project_id=project_id,
            user_name=user_name,
            purpose="provision",
            gpus=instance.gpus * count,
            estimated_cost=instance.price_per_hour * count * max(expected_hours, 0.0),
        )
        verdict = await self._admit(query)
        if not verdict.allowed:
            if job_id not in self.refused:
                log.warning("not provisioning %s for %s: %s", instance_name, job_id, verdict.reason)
            self.refused.add(job_id)
            return []
        self.refused.discard(job_id)
        now = utcnow()
        ids = []
        for _ in range(count):
            node_id = rented_node_id(instance.name)
            node = FleetNode(
                node_id=node_id,
                info=None,
                state="provisioning",
                provisioned=True,
                instance_type=instance.name,
                ready_at=time.time() + instance.startup_delay_s,
                reserved_for=job_id,
            )
            event = NodeProvisioned(
                event_id=f"{node_id}:provisioned",
                node_id=node_id,
                instance_type=instance.name,
                provider=self.provider.name,
                price_per_hour=instance.price_per_hour,
                gpu_count=instance.gpus,
                provisioned_at=now,
                for_job_id=job_id,
                limits=rented_limits(node_id, instance),
                project_id=project_id,
                user_name=user_name,
            )
            await self._save(node, [event])
            asyncio.create_task(self._boot(node_id, instance))
            ids.append(node_id)
        return ids

    async def _boot(self, node_id: str, instance: InstanceType) -> None:
        try:
            handle = await self.provider.provision(node_id, instance)
        except Exception as exc:
            log.error("provisioning %s failed: %r", node_id, exc)
            await self.release(node_id, reason="failed to start")
            return
        node = self.nodes.get(node_id)
        if node:
            await self._save(node.model_copy(update={"handle": handle}), [])

    def provisioning(self) -> list[FleetNode]:
        return [n for n in self.nodes.values() if n.state == "provisioning"]

    def overdue(self, now: float) -> list[str]:
        """Provisioned nodes that never registered."""
        return [n.node_id for n in self.provisioning() if n.ready_at and now > n.ready_at + REGISTER_PATIENCE_S]

    def rentable(self, now: float) -> tuple[InstanceType, ...]:
        """The catalogue placement may rent from now: less the types the cloud refused lately and those whose last
        node never registered. The whole catalogue stays the records of the nodes already rented."""
        return tuple(
            i for i in self.catalogue if i.name not in self.cloud_refused and self.unbootable.available(i.name, now)
        )

    async def release(self, node_id: str, *, reason: str) -> bool:
        node = self.nodes.get(node_id)
        if node is None or not node.provisioned or node.state == "released":
            return False
        if reason == "never registered" and node.instance_type:
            self.unbootable.refuse(node.instance_type)
            log.warning(
                "%s (%s) never registered: %s is not rented again for %.0f s (its image, its agent's start or its way "
                "to the bus: see the node's console)",
                node_id,
                node.instance_type,
                node.instance_type,
                UNBOOTABLE_S,
            )
        await self.provider.release(node_id, node.handle)
        event = NodeReleased(event_id=f"{node_id}:released", node_id=node_id, released_at=utcnow(), reason=reason)
        await self._save(node.model_copy(update={"state": "released"}), [event])
        self.idle_since.pop(node_id, None)
        return True

    async def _admit(self, query: AdmitQuery) -> AdmitReply:
        """Billing decides whether paying is allowed; nothing paid starts when billing cannot be asked."""
        try:
            reply = await request(self.broker, query, RPC_ADMIT, timeout=ADMIT_TIMEOUT_S)
            return AdmitReply.model_validate(await reply.decode())
        except Exception as exc:
            return AdmitReply(allowed=False, reason=f"billing did not answer: {exc!r}")

    async def _save(self, node: FleetNode, events: list) -> None:
        """Persist the node (in memory it is authoritative) with its events; raises if the record keeps changing."""
        await self.store.update(node.node_id, lambda _: (node.model_dump(), events))
        self.nodes[node.node_id] = node
        self._track(node)
