from datetime import timedelta

from services.billing.ledger import clip, close_entry, open_entry, totals
from tests.factories import T0

TERMS = {"node_id": "n1", "node_kind": "local", "price_per_hour": 1.0, "node_gpu_count": 0, "gpu_count": 1}


def entry(seconds=3600):
    opened = open_entry(
        key={"job_id": "j", "attempt": 1, "rank": 0}, terms=TERMS, project_id="p", user_name="alice", started_at=T0
    )
    return close_entry(opened, ended_at=opened["started_at"] + timedelta(seconds=seconds), reason="completed")


def test_an_attempt_costs_its_seconds_times_the_node_price():
    e = entry(seconds=1800)
    assert e["seconds"] == 1800 and e["cost"] == 0.5 and e["gpu_hours"] == 0.5


def test_totals_by_user():
    rows = totals([entry(), entry(seconds=7200)], by="user_name")
    assert [(r.key, r.attempts, r.cost) for r in rows] == [("alice", 2, 3.0)]


def test_clip_to_a_window_reprices_the_part_inside():
    e = entry(seconds=3600)
    part = clip(e, start=T0 + timedelta(minutes=30), end=None)
    assert part["seconds"] == 1800 and part["cost"] == 0.5
    assert clip(e, start=T0 + timedelta(hours=2), end=None) is None
