"""What billing knows of each node (kind, GPUs, price, for whom): written when placement rents it or it registers,
read at every task start. Billing alone writes it, so the records it wrote are remembered, not read again."""

from dataclasses import dataclass, field
from typing import Any

import bson
from bson.codec_options import CodecOptions
from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection

from shared.events import NodeProvisioned
from shared.lru import Lru
from shared.noderecords import NodeLimits, admitted
from shared.nodes import NodeInfo

REMEMBERED_NODES = 20_000  # nodes whose kind, GPUs and price are kept in memory (a few hundred bytes each)


def as_read(collection: AsyncCollection, doc: dict[str, Any]) -> dict[str, Any]:
    """The document as a read of it would return it (datetimes to the millisecond, in UTC)."""
    codec = getattr(collection, "codec_options", None) or CodecOptions(tz_aware=True)
    return bson.decode(bson.encode(doc, codec_options=codec), codec_options=codec)


@dataclass
class NodeRecords:
    node_info: AsyncCollection  # node id -> kind, GPUs, price, and for whom a rented node was rented
    # The static nodes' records (cluster file); None: registrations taken as said (in-memory tests only).
    static: dict[str, NodeLimits] | None = None
    # Each node's record as billing last read or wrote it (one leader at a time, which exits when it loses its lease).
    known: Lru[str, dict] = field(default_factory=lambda: Lru(REMEMBERED_NODES), repr=False)

    async def get(self, node_id: str) -> dict[str, Any] | None:
        """What billing knows of the node (remembered as last read or written; billing alone writes it)."""
        known = self.known.get(node_id)
        if known is None:
            known = await self.node_info.find_one({"_id": node_id})
            if known is not None:
                self.known.put(node_id, known)
        return known

    async def registered(self, node: NodeInfo) -> dict[str, Any] | None:
        """The node's record once it registers: a rented node's as placement rented it (its provisioning, kept), a
        static node's its cluster-file entry's (the claims capped to it); None for a node with neither."""
        known = await self.get(node.node_id)
        if known is not None and known.get("source") == "provisioned":
            return known
        if self.static is not None:
            capped, _ = admitted(node, self.static.get(node.node_id))
            if capped is None:
                return None
            node = capped
        info = {"kind": node.kind, "gpu_count": len(node.gpus), "price_per_hour": node.price_per_hour}
        # One write that keeps what else is known of the node (whose rented node it is); numbers and names only.
        return self._written(
            node.node_id,
            await self.node_info.find_one_and_update(
                {"_id": node.node_id}, {"$set": info}, upsert=True, return_document=ReturnDocument.AFTER
            ),
        )

    async def provisioned(self, event: NodeProvisioned) -> dict[str, Any]:
        """A rented node's record: what placement rented it as, and for whom."""
        info = {
            "kind": "on_demand",
            "gpu_count": event.gpu_count,
            "price_per_hour": event.price_per_hour,
            "project_id": event.project_id,
            "user_name": event.user_name,
            "for_job_id": event.for_job_id,
            "_id": event.node_id,
            "source": "provisioned",
        }
        await self.node_info.replace_one({"_id": event.node_id}, info, upsert=True)
        self._written(event.node_id, info)
        return info

    async def released(self, node_id: str) -> None:
        """A rented node given back: its record says so, and nothing it does later is charged to whoever rented it
        (a registration after the release opened a lifetime nothing ever closed, charged to the renter for good)."""
        known = await self.get(node_id)
        if known is None or known.get("source") != "provisioned" or known.get("released"):
            return
        await self.node_info.update_one({"_id": node_id}, {"$set": {"released": True}})
        self._written(node_id, {**known, "released": True})

    def _written(self, node_id: str, info: dict[str, Any] | None) -> dict[str, Any] | None:
        if info is not None:
            self.known.put(node_id, as_read(self.node_info, info))
        return info
