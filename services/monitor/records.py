"""What each node may be, as the monitor knows it: the cluster file's entries (static nodes) and the records of the
nodes placement rented (from their NodeProvisioned, kept in `monitor_rented`). A registration is capped to its
node's record before the monitor stores it (shared/noderecords.py), so GET /v2/nodes shows the node as its record
allows it, with what it claimed beyond that."""

from dataclasses import dataclass, field

from pymongo.asynchronous.collection import AsyncCollection

from shared.events import NodeProvisioned
from shared.noderecords import NodeLimits, admitted
from shared.nodes import NodeInfo


@dataclass
class NodeRecords:
    static: dict[str, NodeLimits] = field(default_factory=dict)
    rented: AsyncCollection | None = None

    async def provisioned(self, event: NodeProvisioned) -> None:
        """Keep a rented node's record (the same event again writes the same)."""
        if self.rented is not None and event.limits is not None:
            await self.rented.replace_one(
                {"_id": event.node_id}, {"_id": event.node_id, **event.limits.model_dump()}, upsert=True
            )

    async def limits(self, node_id: str) -> NodeLimits | None:
        if node_id in self.static:
            return self.static[node_id]
        doc = await self.rented.find_one({"_id": node_id}) if self.rented is not None else None
        return NodeLimits.model_validate({k: v for k, v in doc.items() if k != "_id"}) if doc else None

    async def admit(self, claimed: NodeInfo) -> tuple[NodeInfo | None, dict[str, str]]:
        """The node as its record allows it and what it claimed beyond; None when it has no record."""
        return admitted(claimed, await self.limits(claimed.node_id))
