"""Node liveness in the monitor: heartbeats stay in memory, the database sees changes, a lagging intake fences
nobody."""

import asyncio
from datetime import UTC, datetime, timedelta

from shared.bus import NODE_CADENCE, publish
from shared.clock import as_utc, utcnow
from shared.events import NodeHeartbeat, NodeRegistered, TaskRef
from shared.noderecords import limits_from_entry
from services.monitor.cadence import Cadence
from services.monitor.fleet import Fleet
from services.monitor.handlers import list_nodes
from services.monitor.records import NodeRecords
from tests.factories import T0, exited, node, placed, submitted
from tests.memory import MemoryCollection
from tests.service.conftest import recorder
from tests.unit.test_liveness import Clock

CENTURY_AHEAD = datetime(2100, 1, 1, tzinfo=UTC)


class CountingCollection(MemoryCollection):
    """The nodes collection, counting writes; bulk writes of `$set` updates as the monitor sends them."""

    def __init__(self) -> None:
        super().__init__("nodes")
        self.writes = 0

    async def insert_one(self, doc):
        self.writes += 1
        return await super().insert_one(doc)

    async def replace_one(self, query, doc, upsert=False):
        self.writes += 1
        return await super().replace_one(query, doc, upsert)

    async def bulk_write(self, ops, ordered=True):
        self.writes += 1
        for op in ops:
            await super().update_one(op._filter, op._doc)


async def heard(monitor, event: NodeHeartbeat) -> None:
    """A heartbeat read when it was sent (a node whose clock agrees with the monitor's), and the write it called
    for (if any) done."""
    monitor.wall = lambda: event.occurred_at
    await monitor.heartbeat(event)
    await monitor.written()


def beat(node_id: str, n: int, *, running=(), boot_id: str = "b1", silences: int = 0) -> NodeHeartbeat:
    return NodeHeartbeat(
        event_id=f"{node_id}:{boot_id}:hb:{n}",
        node_id=node_id,
        boot_id=boot_id,
        silences=silences,
        running=running,
        occurred_at=T0 + timedelta(seconds=2 * n),
    )


async def fleet_of(broker, monitor, clock: Clock, *node_ids: str) -> CountingCollection:
    monitor.nodes.collection = CountingCollection()
    monitor.fleet = Fleet(persist_every_s=30, clock=clock)
    for node_id in node_ids:
        await publish(
            broker,
            NodeRegistered(event_id=f"{node_id}:boot:b1", node=node(node_id=node_id), boot_id="b1", occurred_at=T0),
        )
    return monitor.nodes.collection


async def test_heartbeats_touch_the_database_only_when_something_changes(monitor_broker):
    broker, monitor, _ = monitor_broker
    nodes = await fleet_of(broker, monitor, Clock(), "n1")
    assert nodes.writes == 1
    for n in range(1, 11):  # 20 s of heartbeats
        await heard(monitor, beat("n1", n))
    assert nodes.writes == 1 and nodes.docs["n1"]["last_seen"] == T0
    page = await list_nodes({"limit": 10}, monitor)
    assert page["total"] == 1 and page["items"][0]["last_seen"].startswith("2026-01-01T00:00:20")
    await heard(monitor, beat("n1", 11, running=(TaskRef(job_id="j", attempt=1),)))
    assert nodes.writes == 2 and list(nodes.docs["n1"]["running"]) == [{"job_id": "j", "attempt": 1, "rank": 0}]


async def test_last_seen_is_written_in_bulk_now_and_then_and_a_restarted_monitor_reads_it(monitor_broker):
    broker, monitor, _ = monitor_broker
    nodes = await fleet_of(broker, monitor, Clock(), "n1", "n2")
    for n in range(1, 20):
        await heard(monitor, beat("n1", n))
        await heard(monitor, beat("n2", n))
    assert await monitor.persist_seen() == 2 and nodes.writes == 3  # two registrations, one bulk
    assert await monitor.persist_seen() == 0
    monitor.fleet = Fleet()
    assert await monitor.load_fleet() == 2
    assert monitor.fleet.records["n2"].last_seen == T0 + timedelta(seconds=2 * 19)


async def test_a_node_is_lost_only_once_the_monitor_has_read_the_heartbeats_it_received(monitor_broker):
    broker, monitor, _ = monitor_broker
    clock = Clock()
    monitor.started_at -= timedelta(minutes=1)
    await fleet_of(broker, monitor, clock, "n1")
    backlog = [5000]
    monitor.backlog = lambda: backlog[0]
    clock.now += 60
    await monitor.check_silent_nodes(utcnow())
    assert monitor.fleet.records["n1"].state == "ready"  # 5,000 heartbeats wait to be read: no verdict
    backlog[0] = 0
    await monitor.check_silent_nodes(utcnow())
    assert monitor.fleet.records["n1"].state == "lost" and (await monitor.nodes.load("n1"))["state"] == "lost"
    await heard(monitor, beat("n1", 40))
    assert monitor.fleet.records["n1"].state == "ready" and (await monitor.nodes.load("n1"))["state"] == "ready"


class InsertCounting(CountingCollection):
    def __init__(self) -> None:
        super().__init__()
        self.insert_commands = 0

    async def insert_many(self, docs, ordered=True):
        self.insert_commands += 1
        return await super().insert_many(docs, ordered=ordered)


async def test_a_fleet_coming_up_is_stored_in_groups_and_a_node_stored_meanwhile_is_updated(monitor_broker):
    _, monitor, _ = monitor_broker
    monitor.nodes.collection = nodes = InsertCounting()
    monitor.fleet = Fleet(persist_every_s=30, clock=Clock())
    registrations = [
        NodeRegistered(event_id=f"n{i}:boot:b1", node=node(node_id=f"n{i}"), boot_id="b1", occurred_at=T0)
        for i in range(40)
    ]
    await nodes.insert_one(
        {
            "_id": "n7",
            "node_id": "n7",
            "boot_id": "b0",
            "last_seen": T0,
            "state": "lost",
            "rev": 1,
            "_outbox": [],
            "_outbox_n": 0,
        }
    )  # stored by another process just now
    await asyncio.gather(*(monitor.registered(r) for r in registrations))
    assert nodes.insert_commands < 10  # 40 new nodes arrived together
    assert len(nodes.docs) == 40 and all(d["_outbox"] == [] for d in nodes.docs.values())
    assert all(monitor.fleet.records[f"n{i}"].state == "ready" for i in range(40))
    assert nodes.docs["n7"]["boot_id"] == "b1" and nodes.docs["n7"]["info"]["node_id"] == "n7"  # read, updated


async def test_a_large_fleet_is_told_to_heartbeat_less_often_and_judged_by_the_longer_timeout(monitor_broker):
    broker, monitor, _ = monitor_broker
    told: list[dict] = []
    broker.subscriber(NODE_CADENCE)(recorder(told))
    await broker.start()
    clock = Clock()
    monitor.started_at -= timedelta(minutes=5)
    monitor.cadence = Cadence(base_interval_s=2.0, base_timeout_s=10.0, budget_per_s=1.0)  # a fleet of 1/s
    await fleet_of(broker, monitor, clock, "n1", "n2", "n3", "n4")
    await monitor.announce_cadence()
    assert told and told[-1]["interval_s"] == 4.0 and told[-1]["timeout_s"] == 20.0  # 4 nodes, 1 beat a second
    clock.now += 15  # silent longer than the configured 10 s, not longer than the 20 s they were told
    await monitor.check_silent_nodes(utcnow())
    assert all(r.state == "ready" for r in monitor.fleet.records.values())
    clock.now += 6
    await monitor.check_silent_nodes(utcnow())
    assert all(r.state == "lost" for r in monitor.fleet.records.values())
    await monitor.announce_cadence()
    assert len(told) == 1  # nothing changed (lost nodes still count: they may come back), not due again yet


async def test_heartbeats_the_bus_still_holds_for_a_starved_monitor_are_read_before_any_verdict(monitor_broker):
    """The intake's queue is empty, but a heartbeat sits in the server's buffer or the socket: the round trip to the
    server (`settle`) brings it in first, so the node it speaks for is not lost; no answer from the bus, no verdict."""
    broker, monitor, _ = monitor_broker
    clock = Clock()
    monitor.started_at -= timedelta(minutes=1)
    await fleet_of(broker, monitor, clock, "n1", "n2")
    clock.now += 60

    async def delivered_late() -> None:  # what the ping flushes out of the server and the socket
        await heard(monitor, beat("n1", 30))

    monitor.settle = delivered_late
    await monitor.check_silent_nodes(utcnow())
    assert monitor.fleet.records["n1"].state == "ready" and monitor.fleet.records["n2"].state == "lost"
    clock.now += 60

    async def no_answer() -> None:
        raise TimeoutError("no PONG")

    monitor.settle = no_answer
    await monitor.check_silent_nodes(utcnow())
    assert monitor.fleet.records["n1"].state == "ready"  # silent for a minute, but the bus did not answer


async def test_first_heartbeats_of_a_fleet_coming_up_are_read_without_waiting_for_their_writes(monitor_broker):
    """The intake goes on to the next heartbeat while a node's write is in flight: 40 new nodes are stored in a
    few groups, and a node's heartbeats during its write start no second one."""
    _, monitor, _ = monitor_broker
    monitor.nodes.collection = nodes = InsertCounting()
    monitor.fleet = Fleet(persist_every_s=30, clock=Clock())
    for i in range(40):
        await monitor.heartbeat(beat(f"n{i}", 1))  # returns before the node is stored
    assert not monitor.fleet.records and nodes.insert_commands <= 1
    await monitor.heartbeat(beat("n3", 2))  # its first write is still in flight: the clock only
    assert len(monitor._background) == 40  # one write per node, none more
    await monitor.written()
    assert len(nodes.docs) == 40 and nodes.insert_commands < 10
    assert all(monitor.fleet.records[f"n{i}"].state == "ready" for i in range(40))


async def test_a_lost_nodes_queued_starts_are_dropped_and_a_failed_drop_is_retried_while_it_stays_lost(monitor_broker):
    """Starts still queued for a node the monitor declares lost are dropped before its work is placed again: an
    agent that comes back must not run an attempt already given to another node."""
    broker, monitor, _ = monitor_broker
    clock = Clock()
    monitor.started_at -= timedelta(minutes=1)
    await fleet_of(broker, monitor, clock, "n1", "n2")
    asked: list[str] = []
    answers = [TimeoutError("bus away"), None, None]

    async def forget(node_id: str) -> None:
        asked.append(node_id)
        failure = answers.pop(0)
        if failure:
            raise failure

    monitor.forget_starts = forget
    clock.now += 60
    await heard(monitor, beat("n2", 30))
    await monitor.check_silent_nodes(utcnow())
    assert monitor.fleet.records["n1"].state == "lost" and asked == ["n1"]  # n2 spoke: nothing dropped for it
    await monitor.check_silent_nodes(utcnow())
    assert asked == ["n1", "n1"] and not monitor.unforgotten  # the failed drop, retried
    await monitor.check_silent_nodes(utcnow())
    assert asked == ["n1", "n1"]  # once done, not again


async def test_a_node_heard_again_before_its_starts_were_dropped_keeps_what_is_queued_for_it(monitor_broker):
    broker, monitor, _ = monitor_broker
    clock = Clock()
    monitor.started_at -= timedelta(minutes=1)
    await fleet_of(broker, monitor, clock, "n1")
    asked: list[str] = []

    async def forget(node_id: str) -> None:
        asked.append(node_id)
        raise TimeoutError("bus away")

    monitor.forget_starts = forget
    clock.now += 60
    await monitor.check_silent_nodes(utcnow())
    assert asked == ["n1"] and monitor.unforgotten == {"n1"}
    await heard(monitor, beat("n1", 40))  # back: what is queued for it now is its new work
    await monitor.check_silent_nodes(utcnow())
    assert asked == ["n1"] and not monitor.unforgotten


async def test_a_placement_on_a_node_already_lost_sends_it_nothing_and_goes_back_to_the_queue(monitor_broker):
    """Placement may not have heard yet that a node is lost: the monitor starts nothing there (a start queued for
    a lost node runs when its agent comes back, whatever the job has become) and requeues the attempt at once."""
    broker, monitor, seen = monitor_broker
    clock = Clock()
    monitor.started_at -= timedelta(minutes=1)
    await fleet_of(broker, monitor, clock, "n1")
    clock.now += 60
    await monitor.check_silent_nodes(utcnow())
    assert monitor.fleet.records["n1"].state == "lost"
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    job = await monitor.jobs.load("j")
    assert seen["tm.node.cmd.n1.start"] == []
    assert job["phase"] == "Pending" and not job["assignments"] and job["attempts"][-1]["outcome"] == "node_lost"
    await heard(monitor, beat("n1", 40))
    await publish(broker, placed("j", attempt=2))
    assert [s["attempt"] for s in seen["tm.node.cmd.n1.start"]] == [2]  # back: placed there again, started


async def test_a_start_carries_its_nodes_silences_as_last_reported_and_a_refused_one_requeues_its_attempt(
    monitor_broker,
):
    """The agent refuses a start issued at a lower count of silences than its own (one written before the node's
    loss and delivered after the drop of its queued starts); the count comes from the node's latest report, is
    stored with the node, and the refusal's report puts an attempt still waiting for that start back in the queue."""
    broker, monitor, seen = monitor_broker
    clock = Clock()
    await fleet_of(broker, monitor, clock, "n1")
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    await heard(monitor, beat("n1", 1, silences=2))  # back from two silences
    assert (await monitor.nodes.load("n1"))["silences"] == 2
    await publish(broker, submitted(job_id="k"))
    await publish(broker, placed("k"))
    assert [(s["job_id"], s["silences"]) for s in seen["tm.node.cmd.n1.start"]] == [("j", 0), ("k", 2)]
    refusal = exited("j", code=None, reason="terminated")
    await publish(broker, refusal.model_copy(update={"message": "refused: issued before this node last went unheard"}))
    job = await monitor.jobs.load("j")
    assert job["phase"] == "Pending" and not job["assignments"] and job["attempts"][-1]["outcome"] == "stopped"


async def test_the_times_a_node_states_decide_nothing_of_its_liveness_the_monitors_clock_does(monitor_broker):
    # a node whose clock runs a century ahead (or lies) is seen when its heartbeats arrive; set right, what it says
    # next still counts (a last_seen of 2100 made every later heartbeat "older"); silent, it is lost as silent since
    # its last heartbeat as the monitor received it (the time billing closes its lifetime at)
    broker, monitor, _ = monitor_broker
    clock = Clock()
    monitor.started_at -= timedelta(minutes=1)
    await fleet_of(broker, monitor, clock, "n1")
    received = [T0 + timedelta(seconds=10)]
    monitor.wall = lambda: received[0]
    await monitor.heartbeat(beat("n1", 1).model_copy(update={"occurred_at": CENTURY_AHEAD}))
    await monitor.written()
    assert monitor.fleet.records["n1"].last_seen == received[0]
    received[0] += timedelta(seconds=2)
    task = TaskRef(job_id="j", attempt=1)
    await monitor.heartbeat(beat("n1", 2, running=(task,)).model_copy(update={"occurred_at": T0}))
    await monitor.written()
    assert monitor.fleet.records["n1"].running == (task,)
    clock.now += 60
    await monitor.check_silent_nodes(utcnow())
    lost = await monitor.nodes.load("n1")
    assert lost["state"] == "lost" and as_utc(lost["last_seen"]) == T0 + timedelta(seconds=12)


async def test_a_registration_dated_ahead_is_seen_when_it_arrived(monitor_broker):
    broker, monitor, _ = monitor_broker
    monitor.wall = lambda: T0
    ahead = NodeRegistered(event_id="n1:boot:b1", node=node(node_id="n1"), boot_id="b1", occurred_at=CENTURY_AHEAD)
    await publish(broker, ahead)
    assert monitor.fleet.records["n1"].last_seen == T0


async def test_a_last_seen_an_older_monitor_took_from_a_node_s_clock_is_set_right_at_start(monitor_broker):
    broker, monitor, _ = monitor_broker
    await fleet_of(broker, monitor, Clock(), "n1")
    await monitor.nodes.collection.update_one({"_id": "n1"}, {"$set": {"last_seen": CENTURY_AHEAD}})
    monitor.fleet, monitor.wall = Fleet(), lambda: T0 + timedelta(seconds=30)
    assert await monitor.load_fleet() == 1
    assert monitor.fleet.records["n1"].last_seen == T0 + timedelta(seconds=30)
    task = TaskRef(job_id="j", attempt=1)
    await heard(monitor, beat("n1", 16, running=(task,)))  # sent and received at T0 + 32 s
    assert monitor.fleet.records["n1"].running == (task,)
    assert as_utc((await monitor.nodes.load("n1"))["last_seen"]) == T0 + timedelta(seconds=32)


def registration(node_id: str, boot_id: str, *, at: datetime, cpu: float, gpus: int, silences: int = 0):
    return NodeRegistered(
        event_id=f"{node_id}:boot:{boot_id}",
        node=node(node_id=node_id, cpu=cpu, gpus=gpus),
        boot_id=boot_id,
        silences=silences,
        occurred_at=at,
    )


def with_record(monitor, node_id: str) -> None:
    """The node's record: 8 CPUs and 2 GPUs at most."""
    entry = {"id": node_id, "kind": "local", "price_per_hour": 1.0, "cpu_count": 8, "max_gpus": 2}
    monitor.records = NodeRecords(static={node_id: limits_from_entry(entry)}, rented=MemoryCollection("rented"))


async def test_a_restarted_nodes_registration_stored_before_its_first_heartbeat_arrived_still_counts(monitor_broker):
    """The agent heartbeats (core NATS, timed on receipt) before it registers (a stream, timed when stored): on two
    clocks the registration looks 5 ms older than the heartbeat. Its record and refused claims are still the new
    boot's; only liveness is timed."""
    broker, monitor, _ = monitor_broker
    with_record(monitor, "n1")
    monitor.wall = lambda: T0
    await publish(broker, registration("n1", "b1", at=T0, cpu=8, gpus=2))
    assert monitor.fleet.records["n1"].info.cpu_count == 8 and "gpus" not in monitor.fleet.records["n1"].claims_refused
    first = beat("n1", 30, boot_id="b2", silences=1)  # received at T0 + 60 s
    await heard(monitor, first)
    monitor.wall = lambda: first.occurred_at + timedelta(seconds=1)
    await publish(broker, registration("n1", "b2", at=first.occurred_at - timedelta(milliseconds=5), cpu=4, gpus=3))
    stored = await monitor.nodes.load("n1")
    assert (stored["boot_id"], stored["info"]["cpu_count"], len(stored["info"]["gpus"])) == ("b2", 4, 2)
    assert stored["claims_refused"]["gpus"] == "claimed 3, record 2" and stored["silences"] == 1
    assert as_utc(stored["last_seen"]) == first.occurred_at and monitor.fleet.records["n1"].info.cpu_count == 4


async def test_a_new_nodes_refused_claims_are_stored_when_its_heartbeat_came_first(monitor_broker):
    broker, monitor, _ = monitor_broker
    with_record(monitor, "n2")
    first = beat("n2", 1)
    await heard(monitor, first)
    await publish(broker, registration("n2", "b1", at=first.occurred_at - timedelta(milliseconds=5), cpu=16, gpus=1))
    stored = await monitor.nodes.load("n2")
    assert stored["info"]["cpu_count"] == 8 and stored["claims_refused"]["cpu_count"] == "claimed 16.0, record 8.0"
