"""Placement's warm-up at start: a real decision of the engine on a synthetic cluster, which leaves no trace."""

from shared.store import DocumentStore
from services.placement.estimates import Estimates
from services.placement.fairshare import FairShare
from services.placement.fleet import Fleet
from services.placement.policy import Provision, Start
from services.placement.service import Placement
from services.placement.warmup import warm_up
from tests.memory import MemoryCollection
from tests.service.conftest import FakeProvider


class NoBus:
    """A broker that fails the test if anything is published or asked."""

    async def publish(self, *args, **kwargs):
        raise AssertionError("the warm-up published")

    async def request(self, *args, **kwargs):
        raise AssertionError("the warm-up asked another service")


def test_the_warm_up_decides_for_each_kind_of_job_and_changes_nothing():
    broker = NoBus()
    stores = {name: MemoryCollection(name) for name in ("nodes", "jobs", "usage")}
    fleet = Fleet(store=DocumentStore(stores["nodes"], broker), provider=FakeProvider())
    placement = Placement(
        jobs=DocumentStore(stores["jobs"], broker),
        fleet=fleet,
        fair=FairShare(stores["usage"]),
        estimates=Estimates(broker=broker),
    )
    decisions = warm_up(placement.inputs)
    started = {d.job_id: d.node_ids for d in decisions if isinstance(d, Start)}
    assert started == {"warm-up-0": ("warm-up-cpu",), "warm-up-1": ("warm-up-gpu",)}
    assert [d.job_id for d in decisions if isinstance(d, Provision)] == ["warm-up-8"]
    assert placement.queue == {} and fleet.nodes == {} and placement.estimates.cache == {}
    assert all(not collection.docs for collection in stores.values())


def test_a_warm_up_the_engine_fails_on_leaves_placement_to_start(caplog):
    class Broken:
        def job_request(self, item):
            raise ValueError("an engine this synthetic cluster breaks")

    assert warm_up(Broken()) == []  # type: ignore[arg-type]
    assert "warm-up decision failed" in caplog.text
