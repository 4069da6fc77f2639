"""Heartbeats are core NATS: no stream stores them, so no consumer (billing's fleet ledger) receives one."""

import re

from shared import bus, busroles
from shared.events import Message, NodeCadence, NodeHeartbeat


def every_event() -> list[type[Message]]:
    found, pending = [], list(Message.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if hasattr(cls, "subject_template"):
            found.append(cls)
    return found


def test_no_stream_stores_a_heartbeat_and_every_other_node_event_is_stored():
    assert bus.stream_for(NodeHeartbeat.subject_template.format(node_id="n1")) is None
    # the heartbeat interval the monitor announces is as transient as the heartbeats it paces (said again every 30 s)
    assert bus.stream_for(NodeCadence.subject_template) is None
    for cls in every_event():
        if cls not in (NodeHeartbeat, NodeCadence) and cls.subject_template.startswith("tm."):
            sample = re.sub(r"\{[^}]+\}", "x", cls.subject_template)  # each field: one token
            assert bus.stream_for(sample) is not None, f"{cls.__name__} ({cls.subject_template}) is in no stream"


def test_node_consumers_filters_overlap_their_stream_but_never_heartbeats():
    for consumers in busroles.CONSUMERS.values():
        for _, subject in consumers:
            stream = bus.stream_of(subject)
            assert not any(bus.subjects_overlap(bus.HEARTBEATS, s) for s in stream.config.subjects)


def test_subject_overlap_follows_nats_wildcards():
    assert bus.subjects_overlap("tm.node.evt.>", "tm.node.evt.*.registered")
    assert bus.subjects_overlap("tm.node.evt.*", "tm.node.evt.state")
    assert not bus.subjects_overlap("tm.node.evt.*", "tm.node.evt.n1.heartbeat")
    assert not bus.subjects_overlap("tm.node.evt.*.registered", "tm.node.evt.n1.heartbeat")
    assert not bus.subjects_overlap("a.b", "a.b.c") and bus.subjects_overlap("a.>", "a.b.c")


def test_only_the_monitor_listens_to_heartbeats():
    assert bus.HEARTBEATS in busroles.service("monitor").subscribe
    assert not any(bus.HEARTBEATS in busroles.service(r).subscribe for r in busroles.SERVICES if r != "monitor")
    assert bus.NODE_EVENT.format(node_id="n1", event="heartbeat") in busroles.agent("n1").publish
