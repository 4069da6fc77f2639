"""A spot node's notice is believed only on its own node's subject: an agent speaks for its own node only."""

import time

from shared.bus import stream_of
from shared.events import NodeInterrupted
from services.placement.fleet import FleetNode


def rented(node_id: str) -> FleetNode:
    return FleetNode(node_id=node_id, state="ready", provisioned=True, instance_type="a10g.1x", ready_at=time.time())


async def test_a_notice_on_the_nodes_own_subject_takes_its_work_away(placement):
    broker, service, _ = placement
    service.fleet.nodes["od-own-1"] = rented("od-own-1")
    notice = NodeInterrupted(event_id="od-own-1:notice", node_id="od-own-1")
    await broker.publish(notice, notice.subject, stream=stream_of(notice.subject).name)
    assert service.fleet.nodes["od-own-1"].state == "lost"


async def test_a_notice_naming_another_node_is_dropped(placement):
    broker, service, _ = placement
    service.fleet.nodes["od-victim-1"] = rented("od-victim-1")
    forged = NodeInterrupted(event_id="od-victim-1:forged", node_id="od-victim-1")
    subject = "tm.node.evt.od-liar-1.interrupted"  # the liar's own subject, the only one its credentials allow
    await broker.publish(forged, subject, stream=stream_of(subject).name)
    assert service.fleet.nodes["od-victim-1"].state == "ready"
