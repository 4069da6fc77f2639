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
    published = [s for s in busroles.agent(node).publish if not s.startswith("$")]
    assert published and all(any(subjects_overlap(s, d) for d in UNKNOWN_DROPPED) for s in published)
    services = [s for role in busroles.SERVICES for s in busroles.PUBLISHES[role] if s.startswith("tm.node.evt")]
    assert services and not any(subjects_overlap(s, d) for s in services for d in UNKNOWN_DROPPED)
