"""The heartbeat interval grows with the fleet, and changing it never fences a node that heartbeats as told
(services/monitor/cadence.py, services/agent/pace.py)."""

import pytest

from shared.events import NodeCadence
from services.agent.pace import Pace
from services.monitor.cadence import ANNOUNCE_EVERY_S, MAX_INTERVAL_S, Cadence


def cadence(**overrides) -> Cadence:
    fields = dict(base_interval_s=2.0, base_timeout_s=10.0, budget_per_s=2500.0)
    fields.update(overrides)
    return Cadence(**fields)


def test_the_interval_grows_with_the_fleet_past_the_budget_and_the_timeout_with_it():
    c = cadence()
    assert not c.update(5000, 0.0) and (c.interval_s, c.timeout(0.0)) == (2.0, 10.0)  # 2,500 a second: held
    assert c.update(10_000, 1.0) and (c.interval_s, c.timeout(1.0)) == (4.0, 20.0)  # five missed beats, as set
    assert c.update(12_600, 2.0) and c.interval_s == 5.5  # whole steps of half a second
    assert c.update(10_000_000, 3.0) and c.interval_s == MAX_INTERVAL_S


def test_a_longer_timeout_holds_at_once_a_shorter_one_only_after_every_agent_could_follow():
    c = cadence()
    c.update(10_000, 0.0)
    assert c.timeout(0.0) == 20.0  # before any agent slowed down: nobody is fenced for going slower
    assert c.update(2_000, 100.0) and c.interval_s == 2.0
    assert c.timeout(100.0) == 20.0  # agents still at 4 s until they hear the news
    assert c.timeout(100.0 + 20.0 + 4.0 - 0.1) == 20.0  # the old timeout and one beat at the old pace
    assert c.timeout(100.0 + 20.0 + 4.0 + 0.1) == 10.0


def test_a_fleet_near_a_step_does_not_flap_between_two_intervals():
    c = cadence()
    c.update(10_000, 0.0)
    assert not c.update(9_000, 1.0) and c.interval_s == 4.0  # a tenth fewer nodes: kept
    assert not c.update(8_001, 2.0) and c.interval_s == 4.0
    assert c.update(7_900, 3.0) and c.interval_s == 3.5  # a fifth below what chose it: shrinks
    assert not c.update(7_000, 4.0)  # and from there the same rule applies again


def test_without_a_budget_the_interval_never_changes():
    c = cadence(budget_per_s=0)
    assert not c.update(1_000_000, 0.0) and (c.interval_s, c.timeout(0.0)) == (2.0, 10.0)


def test_it_is_announced_on_a_change_and_now_and_then():
    c = cadence()
    assert c.due(0.0, changed=False)  # the first time
    assert not c.due(1.0, changed=False)
    assert c.due(2.0, changed=True)
    assert not c.due(2.0 + ANNOUNCE_EVERY_S - 1, changed=False)
    assert c.due(2.0 + ANNOUNCE_EVERY_S, changed=False)


@pytest.mark.parametrize("fields", [dict(base_interval_s=0), dict(base_timeout_s=-1), dict(budget_per_s=-5)])
def test_a_nonsense_setting_is_refused(fields):
    with pytest.raises(ValueError):
        cadence(**fields)


def announcement(interval_s, timeout_s=60.0) -> bytes:
    return NodeCadence(event_id="c", interval_s=interval_s, timeout_s=timeout_s).model_dump_json().encode()


def test_an_agent_slows_down_as_told_but_never_below_its_own_interval():
    pace = Pace(2.0)
    assert pace.heard(announcement(4.0)) and (pace.interval_s, pace.timeout_s) == (4.0, 60.0)
    assert not pace.heard(announcement(4.0))
    assert pace.heard(announcement(1.0)) and pace.interval_s == 2.0  # faster than configured: not taken


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b'{"event_id": "c", "interval_s": 0, "timeout_s": 1}',
        b'{"event_id": "c", "interval_s": 1e9, "timeout_s": 1}',
        b'{"event_id": "c", "interval_s": "soon", "timeout_s": 1}',
        b"\xff" * 100,
    ],
)
def test_an_announcement_that_does_not_parse_or_is_out_of_bounds_changes_nothing(data):
    pace = Pace(2.0)
    assert not pace.heard(data) and pace.interval_s == 2.0
