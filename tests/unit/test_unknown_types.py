"""Which deliveries of an unknown event type are given back for a newer replica, and for how long."""

import pytest

from shared import busroles
from shared.bus import UNKNOWN_DROPPED, _event_types, subjects_overlap
from shared.events import JobSubmitted
from shared.unknowntypes import UNKNOWN_TYPE_NAK_MAX_S, UNKNOWN_TYPE_PATIENCE_S, give_back_delay, unknown_type
from tests.factories import submitted

KNOWN = _event_types()


def test_only_a_well_formed_envelope_of_a_type_no_event_has_is_unknown():
    assert unknown_type({"type": "NodeDrained", "event_id": "e1", "node_id": "n1"}, known=KNOWN) == "NodeDrained"
    assert unknown_type(submitted().model_dump(mode="json"), known=KNOWN) is None  # known: its own check decides
    assert unknown_type({"type": "JobSubmitted", "event_id": "e"}, known=KNOWN) is None  # known, invalid: dropped
    jetstream_answer = {"type": "io.nats.jetstream.api.v1.consumer_info_response", "stream_name": "TM_JOBS"}
    for garbage in (jetstream_answer, {"type": 7, "event_id": "e"}, {"event_id": "e"}, [1], "x", None):
        assert unknown_type(garbage, known=KNOWN) is None, garbage
    assert unknown_type({"type": "X", "event_id": "e", "occurred_at": "yesterday"}, known=KNOWN) is None
    assert JobSubmitted.model_fields["type"].default in KNOWN


def test_an_unknown_type_is_given_back_with_backoff_until_it_is_too_old_to_wait_for():
    delays = [give_back_delay(deliveries=n, age_s=1.0) for n in range(1, 9)]
    assert delays == [1, 2, 4, 8, 16, UNKNOWN_TYPE_NAK_MAX_S, UNKNOWN_TYPE_NAK_MAX_S, UNKNOWN_TYPE_NAK_MAX_S]
    assert give_back_delay(deliveries=3, age_s=UNKNOWN_TYPE_PATIENCE_S) is None
    assert give_back_delay(deliveries=10**6, age_s=0.0) == UNKNOWN_TYPE_NAK_MAX_S


@pytest.mark.parametrize("node", ["n1", "gpu-7"])
def test_every_subject_an_agent_may_publish_drops_unknown_types(node):
    """An agent's garbage must never hold a consumer back: each of its stream subjects is among those dropped."""
    published = [s for s in busroles.agent(node).publish if not s.startswith(("$", "tm.rpc."))]  # rpc: no stream
    assert published and all(any(subjects_overlap(s, d) for d in UNKNOWN_DROPPED) for s in published)
    services = [s for role in busroles.SERVICES for s in busroles.PUBLISHES[role] if s.startswith("tm.node.evt")]
    assert services and not any(subjects_overlap(s, d) for s in services for d in UNKNOWN_DROPPED)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def held_message(seq: int, *, consumer: str = "placement-jobs"):
    """A JetStream delivery as the decoder sees it: the server's metadata (stored just now, delivered once)."""
    from datetime import timedelta
    from types import SimpleNamespace

    from shared.clock import utcnow

    meta = SimpleNamespace(
        stream="TM_JOBS",
        consumer=consumer,
        sequence=SimpleNamespace(stream=seq),
        num_delivered=1,
        timestamp=utcnow() - timedelta(seconds=1),
    )
    return SimpleNamespace(raw_message=SimpleNamespace(subject="tm.job.status", metadata=meta))


def outcome(message, *, slots: int) -> str:
    from faststream.exceptions import NackMessage, RejectMessage

    from shared.unknowntypes import hold_or_drop

    try:
        hold_or_drop(message, kind="NodeDrained", held_here=True, slots=slots)
    except NackMessage:
        return "held"
    except RejectMessage:
        return "dropped"
    raise AssertionError("neither held nor dropped")


def test_a_consumer_never_holds_more_than_a_share_of_its_slots(monkeypatch):
    """A held delivery keeps its slot at the server: 32 held events stopped a keyed jobs consumer (no job placed)
    for up to ten minutes. Now a quarter of its slots at most; the rest are dropped, and a known event always has
    a slot."""
    from shared import unknowntypes

    monkeypatch.setattr(unknowntypes, "HOLDS", unknowntypes.Holds(clock=FakeClock()))
    got = [outcome(held_message(seq), slots=32) for seq in range(1, 34)]
    assert got == ["held"] * 8 + ["dropped"] * 25
    assert outcome(held_message(3), slots=32) == "held"  # one it holds is held again when offered again
    assert outcome(held_message(1, consumer="billing-fleet"), slots=1) == "held"  # each consumer its own
    assert outcome(held_message(2, consumer="billing-fleet"), slots=1) == "dropped"


def test_a_consumer_holds_for_the_patience_once_in_its_process_not_once_per_event(monkeypatch):
    """A rollback leaves events of the newer version in the streams: an ordered consumer used to stall ten
    minutes for each of them in turn."""
    from shared import unknowntypes

    clock = FakeClock()
    monkeypatch.setattr(unknowntypes, "HOLDS", unknowntypes.Holds(clock=clock))
    assert outcome(held_message(1, consumer="billing-fleet"), slots=1) == "held"
    for _ in range(int(UNKNOWN_TYPE_PATIENCE_S // UNKNOWN_TYPE_NAK_MAX_S)):
        clock.now += UNKNOWN_TYPE_NAK_MAX_S
        outcome(held_message(1, consumer="billing-fleet"), slots=1)
    clock.now += UNKNOWN_TYPE_NAK_MAX_S
    assert outcome(held_message(1, consumer="billing-fleet"), slots=1) == "dropped"
    clock.now += 3600
    assert outcome(held_message(2, consumer="billing-fleet"), slots=1) == "dropped"  # no successor came: spent
    assert outcome(held_message(2, consumer="placement-jobs"), slots=32) == "held"


def test_a_delivery_a_newer_replica_took_is_forgotten(monkeypatch):
    from shared import unknowntypes

    clock = FakeClock()
    monkeypatch.setattr(unknowntypes, "HOLDS", unknowntypes.Holds(clock=clock))
    assert outcome(held_message(1, consumer="billing-fleet"), slots=1) == "held"
    clock.now += 3 * UNKNOWN_TYPE_NAK_MAX_S  # not offered here again: another replica acknowledged it
    assert outcome(held_message(2, consumer="billing-fleet"), slots=1) == "held"
