"""Billing over in-memory collections, for handler tests: every part built as the service builds it."""

from typing import Any

from shared.store import DocumentStore
from services.billing.placements import Placements
from services.billing.service import Billing, build
from tests.factories import T0
from tests.memory import Clock, MemoryCollection

COLLECTIONS = ("ledger", "ends", "nodes", "nodes_open", "node_info", "quotas")
PLACEMENTS = ("jobs", "attempts", "parked")


def in_memory(broker: Any, **given: Any) -> Billing:
    """Billing with each collection in memory unless given (a `ReadCounting` one, say), its clock at T0 and its
    alerts published on `broker`; `static` and `reconcile_grace_s` as given."""

    def collection(name: str) -> Any:
        return given.pop(name) if name in given else MemoryCollection(name)

    collections = {name: collection(name) for name in COLLECTIONS}
    placements = Placements(**{name: collection(name) for name in PLACEMENTS})
    return build(
        **collections,
        alerts=DocumentStore(collection("alerts"), broker),
        placements=placements,
        static=given.pop("static", None),
        clock=given.pop("clock", Clock(T0)),
        **given,
    )
