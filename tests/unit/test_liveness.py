from datetime import timedelta

from services.monitor.nodes import declare_lost, sighted, silent
from tests.factories import T0, node


def test_a_new_node_is_ready_and_announced():
    s = sighted(None, node_id="n", boot_id="b1", at=T0, info=node(node_id="n"))
    assert s.node.state == "ready" and s.event.state == "ready" and not s.restarted


def test_a_new_boot_id_is_a_restart():
    first = sighted(None, node_id="n", boot_id="b1", at=T0).node
    s = sighted(first, node_id="n", boot_id="b2", at=T0 + timedelta(seconds=1))
    assert s.restarted


def test_an_older_heartbeat_does_not_move_last_seen_back_but_keeps_registration_info():
    hb = sighted(None, node_id="n", boot_id="b1", at=T0 + timedelta(seconds=5)).node
    s = sighted(hb, node_id="n", boot_id="b1", at=T0, info=node(node_id="n"))
    assert s.node.last_seen == T0 + timedelta(seconds=5) and s.node.info is not None


def test_silent_nodes_are_found_and_a_lost_node_comes_back():
    n = sighted(None, node_id="n", boot_id="b", at=T0).node
    assert silent([n], now=T0 + timedelta(seconds=5), timeout_s=10) == []
    assert silent([n], now=T0 + timedelta(seconds=11), timeout_s=10) == [n]
    lost, event = declare_lost(n)
    assert lost.state == "lost" and event.state == "lost"
    back = sighted(lost, node_id="n", boot_id="b", at=T0 + timedelta(seconds=20))
    assert back.node.state == "ready" and back.event.state == "ready"
