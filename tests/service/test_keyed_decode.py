"""A state machine's consumer validates each event once: its handler gets the very event its decoder checked."""

from faststream.nats import NatsBroker, TestNatsBroker

from shared.context import NatsMessage
from shared.events import JobDeleted, JobEvent
from shared.keyed import keyed_durable
from tests.factories import exited, unique


async def _ignored(service: object, event: object) -> None:
    pass


async def test_the_handler_gets_the_event_its_decoder_validated_not_a_second_copy():
    jobs = keyed_durable("tm.job.>", consumer=unique("keyed"), event=JobEvent, handles={JobDeleted: _ignored})
    decoded, handled = [], []

    async def decoder(msg, decode):
        event = await jobs.decode(msg, decode)
        decoded.append(event)
        return event

    broker = NatsBroker()

    @broker.subscriber(**{**jobs.subscription, "decoder": decoder})
    @jobs.in_order()
    async def on_event(event: JobEvent, message: NatsMessage) -> None:
        handled.append(event)

    forged = exited(unique("j"), node_id="n2")
    async with TestNatsBroker(broker) as test_broker:
        event = JobDeleted(event_id=unique("e"), job_id=unique("j"))
        await test_broker.publish(event.model_dump(mode="json"), event.subject, stream="TM_JOBS")
        # still checked against its subject: n2's exit on n1's subject never reaches the handler
        await test_broker.publish(forged.model_dump(mode="json"), "tm.job.task.n1.exited", stream="TM_JOBS")

    assert len(handled) == 1 and handled[0] == event
    assert handled[0] is decoded[0]
