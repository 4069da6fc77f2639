"""Order per key, concurrency across keys: the state machines' consumers (`shared.bus.in_order`)."""
import asyncio

from pymongo.errors import AutoReconnect

from shared.bus import in_order


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
