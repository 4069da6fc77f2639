"""What an idle consumer costs the bus: a pull request each `shared.bus.PULL_WAIT_S` (2 s), not two a second; a
message that comes while one waits is still delivered and handled."""

import asyncio

import nats
import pytest

from shared.bus import connect, durable, make_broker, publish, stream_of
from shared.events import JobDeleted
from tests.conftest import eventually
from tests.factories import unique

pytestmark = pytest.mark.integration
IDLE_S = 4.0


async def test_an_idle_consumer_sends_a_pull_request_each_wait_and_still_gets_a_message_at_once(bus_and_database):
    consumer = unique("idle")
    spy = await nats.connect(bus_and_database.nats_url, user_credentials=str(bus_and_database.admin_creds()))
    requests: list[bytes] = []

    async def count(message) -> None:
        requests.append(message.data)

    await spy.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{stream_of('tm.job.deleted').name}.{consumer}", cb=count)
    broker = make_broker(bus_and_database.nats_url, name="test", creds=bus_and_database.admin_creds())
    handled: list[str] = []

    @broker.subscriber(**durable("tm.job.deleted", consumer=consumer, ordered=False, deliver_new=True))
    async def on_deleted(event: JobDeleted) -> None:
        handled.append(event.job_id)

    async def fetching() -> bool:
        return bool(requests)

    async def got(job_id: str) -> bool:
        return handled == [job_id]

    await connect(broker)
    await broker.start()
    try:
        await eventually(fetching)
        requests.clear()
        await asyncio.sleep(IDLE_S)
        # at 0.5 s a wait, eight requests in the 4 s; now one each 2 s (one more where a wait ends at the edge)
        assert len(requests) <= 3, len(requests)
        job_id = unique("gone")
        await publish(broker, JobDeleted(event_id=f"{job_id}:deleted", job_id=job_id))
        await eventually(lambda: got(job_id))
    finally:
        await broker.stop()
        await spy.close()
