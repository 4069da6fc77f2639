"""Order per key, concurrency across keys: the state machines' consumers (`shared.keyed`)."""

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from faststream.exceptions import NackMessage, RejectMessage
from pymongo.errors import AutoReconnect

from shared import keyed
from shared.bus import ACK_WAIT_S
from shared.events import JobEvent, TaskStarted
from shared.keyed import DeliveryOrder, in_order, keyed_durable, redelivery_wait


async def run_batch(handler, events) -> None:
    """What FastStream does with a fetched batch: start one task per message, in order, and wait for all."""
    await asyncio.gather(*(asyncio.create_task(handler(e)) for e in events))


async def test_one_keys_events_stay_in_order_while_other_keys_go_ahead():
    log: list[tuple[str, int]] = []
    release = asyncio.Event()

    @in_order(lambda e: e[0])
    async def handle(event):
        if event == ("slow", 1):
            await release.wait()
        log.append(event)

    batch = asyncio.create_task(run_batch(handle, [("slow", 1), ("slow", 2), ("fast", 1), ("fast", 2)]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert log == [("fast", 1), ("fast", 2)]  # not held up behind the slow job
    release.set()
    await batch
    assert [e for e in log if e[0] == "slow"] == [("slow", 1), ("slow", 2)]


async def test_a_keyless_event_waits_for_all_before_it_and_holds_back_all_after_it():
    log: list[str] = []

    @in_order(lambda e: None if e == "barrier" else e[0])
    async def handle(event):
        await asyncio.sleep(0.01 if event == "a1" else 0)
        log.append(event)

    await run_batch(handle, ["a1", "b1", "barrier", "b2", "a2"])
    assert log.index("barrier") > max(log.index("a1"), log.index("b1"))
    assert log.index("barrier") < min(log.index("b2"), log.index("a2"))
    assert handle.turns.in_flight() == 0


async def test_a_passing_failure_is_retried_in_place_so_no_later_event_of_its_key_overtakes_it():
    log: list[str] = []
    failures = iter([True, True, False])

    @in_order(lambda e: e[0], retry_s=0.001)
    async def handle(event):
        if event == "j1" and next(failures):
            raise AutoReconnect("database away")
        log.append(event)

    await run_batch(handle, ["j1", "j2", "k1"])
    assert log.index("j1") < log.index("j2") and sorted(log) == ["j1", "j2", "k1"]


def delivered(seq: int) -> SimpleNamespace:
    """A JetStream message as the handler's `message` parameter sees it: only its consumer sequence matters."""
    return SimpleNamespace(
        raw_message=SimpleNamespace(metadata=SimpleNamespace(sequence=SimpleNamespace(consumer=seq)))
    )


async def test_deliveries_that_reach_the_handler_out_of_order_are_taken_in_delivery_order():
    log: list[int] = []
    deliveries = DeliveryOrder()
    deliveries.resume_after(9)

    @in_order(lambda e: "one job", deliveries=deliveries)
    async def handle(event, message):
        log.append(event)

    # the tasks of one fetched batch reach the handler in another order than the batch's (seen under load)
    await asyncio.gather(*(handle(event=seq, message=delivered(seq)) for seq in (12, 10, 13, 11)))
    assert log == [10, 11, 12, 13]


async def test_a_turn_that_comes_as_the_wait_runs_out_is_no_lost_delivery(caplog):
    # it logged "delivery 34: deliveries 34-33 never reached the handler" where none was lost
    deliveries = DeliveryOrder(patience_s=0.05)
    deliveries.resume_after(32)
    waiting = asyncio.ensure_future(deliveries.wait(34))
    await asyncio.sleep(0)
    deliveries.last = 33  # delivery 33 took its turn; its wake-up of 34 lost the race with the timeout
    await asyncio.wait_for(waiting, 2)
    assert "never reached the handler" not in caplog.text
    deliveries.resume_after(40)
    await asyncio.wait_for(deliveries.wait(42), 2)  # 41 never comes: that is said
    assert "deliveries 41-41 never reached the handler" in caplog.text


async def test_a_delivery_that_never_reaches_the_handler_holds_the_next_only_for_a_while():
    log: list[int] = []
    deliveries = DeliveryOrder(patience_s=0.05)
    deliveries.resume_after(1)

    @in_order(lambda e: e, deliveries=deliveries)
    async def handle(event, message):
        log.append(event)

    await asyncio.wait_for(handle(event=3, message=delivered(3)), 2)  # delivery 2 went to a process that died
    await handle(event=4, message=delivered(4))
    assert log == [3, 4] and deliveries.last == 4


async def test_the_key_is_read_from_the_event_parameter_whatever_the_order_of_the_others():
    keys: list[str | None] = []

    def key(event):
        keys.append(event)
        return event

    @in_order(key)
    async def handle(monitor, message, event):
        return event

    assert await handle(monitor="m", message=None, event="job-1") == "job-1"
    assert keys == ["job-1"]


async def test_a_delivery_dropped_before_the_handler_does_not_hold_up_the_next_one():
    log: list[int] = []
    deliveries = DeliveryOrder(patience_s=30)  # a wait would time the test out
    deliveries.resume_after(4)

    @in_order(lambda e: e, deliveries=deliveries)
    async def handle(event, message):
        log.append(event)

    deliveries.skip(6)  # dropped before 5 even arrived
    deliveries.skip(5)
    await asyncio.wait_for(handle(event=7, message=delivered(7)), 1)
    assert log == [7] and deliveries.last == 7


async def _ignored(service: object, event: object) -> None:
    pass


async def test_a_keyed_consumer_rejects_what_is_no_event_of_its_own_and_skips_it_in_the_delivery_order():
    jobs = keyed_durable("tm.job.>", consumer="monitor-jobs", event=JobEvent, handles={TaskStarted: _ignored})
    jobs.deliveries.resume_after(9)
    msg = delivered(10)
    msg.raw_message.subject = "tm.job.task.n1.started"

    async def decode(_):
        return {"type": "TaskStarted", "job_id": "j"}  # a hostile or broken publisher: fields missing

    with pytest.raises(RejectMessage):
        await jobs.decode(msg, decode)
    assert jobs.deliveries.last == 10


async def test_a_keyed_consumer_declared_for_another_version_gives_back_every_delivery_from_the_first_it_cannot_read():
    """A deploy's declaration widened the consumer while this (older) replica reads it: what its table does not name
    goes back to the consumer for the new version's replica, and so does every later delivery, which would
    otherwise be handled before an earlier event of its job."""
    started = {"type": "TaskStarted", "job_id": "j", "node_id": "n1"}
    jobs = keyed_durable("tm.job.>", consumer="monitor-jobs", event=JobEvent, handles={TaskStarted: _ignored})
    jobs.deliveries.resume_after(9)
    foreign, later = delivered(10), delivered(11)
    foreign.raw_message.subject, later.raw_message.subject = "tm.job.status", "tm.job.task.n1.started"

    async def decode(_):
        return started

    for msg in (foreign, later):
        with pytest.raises(NackMessage) as given_back:
            await jobs.decode(msg, decode)
        assert 0 < given_back.value.extra_options["delay"] < ACK_WAIT_S
    assert jobs.superseded_by == "tm.job.status" and jobs.deliveries.last == 11
    in_memory = SimpleNamespace(raw_message=SimpleNamespace(subject="tm.job.status"))  # not filtered by a server
    assert not keyed_durable("tm.job.>", consumer="m", event=JobEvent, handles={}).superseded(in_memory)


def test_a_new_reader_waits_only_until_what_the_dead_one_held_is_due_again():
    now = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)
    # the leader died right after a delivery; its replica took over 6 s later: 10 + 1 - 6 = 5 s more
    assert redelivery_wait(now - timedelta(seconds=6), now=now) == pytest.approx(ACK_WAIT_S + 1 - 6)
    assert redelivery_wait(now - timedelta(seconds=60), now=now) == 0.0  # long due: redelivered already
    assert redelivery_wait(now + timedelta(seconds=30), now=now) == ACK_WAIT_S + 1  # a skewed clock: never longer
    assert redelivery_wait(None, now=now) == ACK_WAIT_S + 1  # unknown: the whole wait, as before


def test_which_subjects_a_consumer_reads_is_remembered_within_a_bound(monkeypatch):
    """Each delivery's subject is checked against the consumer's filters; the answer kept per subject (a bounded
    set: statuses and nodes), forgotten once the bound is reached, and the same either way."""
    monkeypatch.setattr(keyed, "READ_SUBJECTS_KEPT", 3)
    jobs = keyed_durable("tm.job.>", consumer="monitor-jobs", event=JobEvent, handles={TaskStarted: _ignored})
    subjects = [f"tm.job.task.n{i}.started" for i in range(5)] + ["tm.job.status", "tm.job.task.n1.exited"]
    for _ in range(2):
        assert [jobs.reads(s) for s in subjects] == [True] * 5 + [False, False]
        assert len(jobs._read) <= 3
