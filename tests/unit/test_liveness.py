from datetime import timedelta

from shared.events import TaskRef
from services.monitor.fleet import Fleet
from services.monitor.nodes import changed, declare_lost, overdue, record_of, sighted, silent, stale
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


def test_a_heartbeat_that_moves_only_the_clock_is_no_change_but_new_tasks_are():
    n = sighted(None, node_id="n", boot_id="b", at=T0, info=node(node_id="n")).node
    beat = sighted(n, node_id="n", boot_id="b", at=T0 + timedelta(seconds=2), running=(), gpu_utilization=0.5).node
    assert not changed(n, beat) and changed(None, beat)
    busy = sighted(n, node_id="n", boot_id="b", at=T0 + timedelta(seconds=2), running=(TaskRef(job_id="j", attempt=1),))
    assert changed(n, busy.node)


def test_the_stored_last_seen_is_refreshed_only_every_so_often():
    assert stale(None, T0, every_s=30)
    assert not stale(T0, T0 + timedelta(seconds=29), every_s=30)
    assert stale(T0, T0 + timedelta(seconds=30), every_s=30)


def test_a_monitor_behind_its_heartbeats_declares_nobody_lost():
    heard = {"a": 100.0, "b": 95.0}
    assert overdue(heard, ["a", "b"], caught_up_at=104.0, timeout_s=10) == []  # b's beats may still be queued
    assert overdue(heard, ["a", "b"], caught_up_at=106.0, timeout_s=10) == ["b"]
    assert (
        overdue(heard, ["a"], caught_up_at=1000.0, timeout_s=10) == ["a"]
        and overdue({}, ["c"], caught_up_at=1e6, timeout_s=10) == []
    )


def test_the_bulk_written_last_seen_counts_when_it_is_newer():
    doc = {"_id": "n", "node_id": "n", "last_seen": T0, "last_seen_s": (T0 + timedelta(seconds=40)).timestamp()}
    assert record_of(doc).last_seen == T0 + timedelta(seconds=40)
    assert record_of({**doc, "last_seen_s": 0}).last_seen == T0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_fleet_keeps_beats_in_memory_and_judges_as_of_its_last_catch_up():
    clock = Clock()
    fleet = Fleet(persist_every_s=30, clock=clock)
    n = sighted(None, node_id="n", boot_id="b", at=T0).node
    fleet.loaded(n)
    assert not fleet.beat(n.model_copy(update={"last_seen": T0 + timedelta(seconds=2)}))
    assert fleet.beat(n.model_copy(update={"last_seen": T0 + timedelta(seconds=31)})) and fleet.dirty == {"n"}
    assert [r.last_seen for r in fleet.take_dirty()] == [T0 + timedelta(seconds=31)] and not fleet.dirty
    clock.now += 60  # silent for a minute, but the intake was never seen caught up since
    assert fleet.overdue(10) == []
    fleet.caught_up()
    assert fleet.overdue(10) == ["n"] and fleet.overdue(10, among=("other",)) == []
    fleet.hear("n")
    assert fleet.overdue(10) == []


def test_the_fleet_pages_nodes_by_id():
    fleet = Fleet()
    for node_id in ("c", "a", "b"):
        fleet.loaded(sighted(None, node_id=node_id, boot_id="b", at=T0).node)
    total, page = fleet.page(offset=1, limit=5)
    assert total == 3 and [n.node_id for n in page] == ["b", "c"]
    fleet.stored(sighted(None, node_id="0", boot_id="b", at=T0).node)
    assert [n.node_id for n in fleet.page(offset=0, limit=2)[1]] == ["0", "a"]


def test_a_late_registration_of_the_current_boot_sets_its_record_and_never_lowers_its_silences():
    hb = sighted(None, node_id="n", boot_id="b1", at=T0 + timedelta(seconds=5), silences=3).node
    s = sighted(hb, node_id="n", boot_id="b1", at=T0, silences=2, info=node(node_id="n", cpu=4), claims_refused={})
    assert (s.node.info.cpu_count, s.node.silences, s.node.last_seen) == (4, 3, T0 + timedelta(seconds=5))
    later = sighted(s.node, node_id="n", boot_id="b1", at=T0 + timedelta(seconds=7), silences=2)
    assert later.node.silences == 3
