"""The monitor's fence (stop what a node still runs for a superseded attempt) reads no job it remembers as it last
wrote it: a node's running set changes at every task's start and end. A job it does not remember is read, and the
look now and then while the running set stays the same reads every job as stored."""

from datetime import UTC, datetime

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish, stream_of
from shared.events import NodeRegistered, TaskRef
from shared.store import DocumentStore
from services.monitor.fleet import Fleet
from services.monitor.handlers import router as monitor_router
from services.monitor.service import Monitor
from tests.factories import T0, exited, node, placed, started, submitted
from tests.memory import MemoryCollection
from tests.service.conftest import recorder
from tests.service.test_monitor_liveness import beat, heard
from tests.unit.test_liveness import Clock

STOPS = "tm.node.cmd.n1.stop"


class CountingReads(MemoryCollection):
    """The jobs collection, counting reads."""

    def __init__(self) -> None:
        super().__init__("jobs")
        self.reads = 0

    def find(self, query=None, projection=None):
        self.reads += 1
        return super().find(query, projection)

    async def find_one(self, query, projection=None):
        self.reads += 1
        return await super().find_one(query, projection)


@pytest.fixture
async def monitor():
    """The monitor as `services.monitor.app` builds it (jobs remembered as last written) and the stops it sends n1."""
    broker = NatsBroker()
    broker.include_router(monitor_router)
    stops: list[dict] = []
    broker.subscriber(STOPS, stream=stream_of(STOPS))(recorder(stops))
    async with TestNatsBroker(broker) as test_broker:
        service = Monitor(
            jobs=DocumentStore(CountingReads(), test_broker, remember=64),
            nodes=DocumentStore(MemoryCollection("nodes"), test_broker),
            node_timeout_s=10,
            started_at=datetime.now(UTC),
            fleet=Fleet(persist_every_s=30, clock=Clock()),
        )
        test_broker.context.set_global("monitor", service)
        await publish(
            test_broker, NodeRegistered(event_id="n1:boot:b1", node=node(node_id="n1"), boot_id="b1", occurred_at=T0)
        )
        for event in (submitted(job_id="j"), placed("j"), started("j")):
            await publish(test_broker, event)
        yield test_broker, service, stops


RUNNING = (TaskRef(job_id="j", attempt=1),)


async def test_a_running_set_that_changes_is_fenced_without_reading_a_job_the_monitor_remembers(monitor):
    _, service, stops = monitor
    reads = service.jobs.collection.reads
    await heard(service, beat("n1", 1, running=RUNNING))  # the task's start reaches the node's record
    await heard(service, beat("n1", 2))  # ... and its end
    assert service.jobs.collection.reads == reads and stops == []


async def test_a_remembered_job_that_superseded_the_task_still_fences_it(monitor):
    broker, service, stops = monitor
    await publish(broker, exited("j"))  # the job completed; its node still says the task runs
    reads = service.jobs.collection.reads
    await heard(service, beat("n1", 1, running=RUNNING))
    assert [(s["job_id"], s["attempt"], s["reason"]) for s in stops] == [("j", 1, "fenced")]
    assert service.jobs.collection.reads == reads


async def test_a_job_not_remembered_is_read(monitor):
    _, service, stops = monitor
    service.jobs = DocumentStore(service.jobs.collection, service.jobs.broker, remember=64)  # a new process
    reads = service.jobs.collection.reads
    await heard(service, beat("n1", 1, running=RUNNING))
    assert stops == [] and service.jobs.collection.reads == reads + 1


async def test_the_look_now_and_then_reads_what_is_stored_whatever_the_monitor_remembers(monitor):
    _, service, stops = monitor
    await heard(service, beat("n1", 1, running=RUNNING))
    # another writer (a monitor that took over for a while) moved the job on: this process's copy is stale
    service.jobs.collection.docs["j"] |= {"attempt": 2}
    await heard(service, beat("n1", 2, running=RUNNING))  # the running set did not change: no look
    assert stops == []
    await heard(service, beat("n1", 20, running=RUNNING))  # 38 s on, its stored last_seen is stale: a look
    assert [(s["job_id"], s["attempt"], s["reason"]) for s in stops] == [("j", 1, "fenced")]
