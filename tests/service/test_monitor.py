"""The monitor's handlers under TestNatsBroker, with its collections in memory."""
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish, stream_of
from shared.store import DocumentStore
from services.monitor import state
from services.monitor.handlers import router
from services.monitor.service import Monitor
from tests.factories import exited, placed, started, submitted
from tests.memory import MemoryCollection

WATCHED = ("tm.job.status", "tm.node.cmd.n9.stop", "tm.node.cmd.n1.start")


@asynccontextmanager
async def monitor_on_bus(watched: tuple[str, ...]):
    """The monitor's router on a test broker, and what it publishes on the watched subjects."""
    broker = NatsBroker()
    broker.include_router(router)
    seen: dict[str, list[dict]] = {subject: [] for subject in watched}
    for subject in watched:
        broker.subscriber(subject, stream=stream_of(subject))(recorder(seen[subject]))

    async with TestNatsBroker(broker) as test_broker:
        monitor = Monitor(jobs=DocumentStore(MemoryCollection("jobs"), test_broker),
                          nodes=DocumentStore(MemoryCollection("nodes"), test_broker),
                          node_timeout_s=10, started_at=datetime.now(UTC))
        test_broker.context.set_global("monitor", monitor)
        yield test_broker, monitor, seen


@pytest.fixture
async def monitor_broker():
    async with monitor_on_bus(WATCHED) as bus:
        yield bus


def recorder(into: list):
    async def record(event: dict) -> None:
        into.append(event)

    return record


def versions(seen):
    return [(e["version"], e["phase"]) for e in seen["tm.job.status"]]


async def test_lifecycle_events_drive_the_status_and_each_change_is_published_once(monitor_broker):
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), placed("j"), started("j"), exited("j")]:
        await publish(broker, event)
    assert versions(seen) == [(1, "Pending"), (2, "Pending"), (3, "Running"), (4, "Completed")]
    doc = await monitor.jobs.load("j")
    assert doc["phase"] == "Completed" and doc["_outbox"] == []


async def test_a_redelivered_event_changes_nothing(monitor_broker):
    broker, monitor, seen = monitor_broker
    for event in [submitted(job_id="j"), submitted(job_id="j"), placed("j"), placed("j")]:
        await publish(broker, event)
    assert [v for v, _ in versions(seen)] == [1, 2]
    assert (await monitor.jobs.load("j"))["version"] == 2
    assert [s["event_id"] for s in seen["tm.node.cmd.n1.start"]] == ["j:1:0:start"]


async def test_the_monitor_starts_the_ranks_of_a_placement_it_accepts(monitor_broker):
    broker, _, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j", command="python train.py"))
    [start] = seen["tm.node.cmd.n1.start"]
    assert (start["job_id"], start["attempt"], start["rank"], start["algorithm"]["command"]) == (
        "j", 1, 0, "python train.py")


async def test_a_job_terminated_before_its_placement_arrives_is_never_started(monitor_broker):
    broker, monitor, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await monitor.apply("j", lambda job: state.terminate(job, requested_by="bob", now=datetime.now(UTC)))
    await publish(broker, placed("j"))
    assert seen["tm.node.cmd.n1.start"] == [] and seen["tm.node.cmd.n9.stop"] == []
    assert (await monitor.jobs.load("j"))["phase"] == "Terminated"


async def test_a_task_of_an_unknown_attempt_is_told_to_stop(monitor_broker):
    broker, _, seen = monitor_broker
    await publish(broker, submitted(job_id="j"))
    await publish(broker, started("j", node_id="n9"))
    assert [(s["attempt"], s["reason"]) for s in seen["tm.node.cmd.n9.stop"]] == [(1, "fenced")]
