"""A process answers only into an identity's inbox, whatever reply subject a request or an event names."""

from faststream.nats import TestNatsBroker

from shared.bus import durable, make_broker
from tests.factories import exited, unique


async def test_a_request_or_event_aimed_at_a_platform_subject_is_not_answered_there():
    broker = make_broker("nats://127.0.0.1:1", name="monitor")
    handled, landed = [], []
    rpc = unique("tm.rpc.test")

    @broker.subscriber(rpc)
    async def answer(query: dict) -> dict:
        handled.append(("rpc", query))
        return {"answer": 42}

    @broker.subscriber(**durable("tm.job.task.>", consumer=unique("monitor-test")))
    async def on_task(event: dict) -> dict:
        handled.append(("event", event["job_id"]))
        return {"answer": 42}

    @broker.subscriber("tm.job.status")
    async def platform(body: dict) -> None:
        landed.append(body)

    async with TestNatsBroker(broker) as test_broker:
        assert await (await test_broker.request({"q": 1}, rpc)).decode() == {"answer": 42}
        await test_broker.publish({"q": 2}, rpc, reply_to="tm.job.status")  # refused: not handled, not answered
        event = exited(unique("j"), node_id="n1")
        await test_broker.publish(
            event.model_dump(mode="json"), event.subject, stream="TM_JOBS", headers={"reply_to": "tm.job.status"}
        )  # handled, never answered
    assert handled == [("rpc", {"q": 1}), ("event", event.job_id)]
    assert landed == []
