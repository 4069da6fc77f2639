from datetime import timedelta

from services.billing.ledger import close_lifetime, open_lifetime, reconcile
from services.billing.usage import Sums, add_entry, idle_parts, owned, rows
from tests.factories import T0


def attempt(*, user="ana", kind="local", node="n1", hours=1.0, price=1.0, gpus=1) -> dict:
    return {
        "user_name": user,
        "node_kind": kind,
        "node_id": node,
        "seconds": hours * 3600,
        "gpu_hours": hours * gpus,
        "cost": hours * price,
        "project_id": "p",
    }


def lifetime(node="od-1", *, hours=2.0, price=3.0, kind="on_demand", user="ana", gpus=1) -> dict:
    opened = open_lifetime(
        node_id=node,
        kind=kind,
        price_per_hour=price,
        gpu_count=gpus,
        started_at=T0,
        project_id="p",
        user_name=user,
        source="provisioned",
    )
    return close_lifetime(opened, ended_at=T0 + timedelta(hours=hours), reason="released")


def test_a_lifetime_costs_its_hours_times_its_price_and_reconciles():
    line = lifetime(hours=2, price=3)
    assert (line["cost"], line["_id"]) == (6.0, f"od-1@{T0.isoformat()}")
    assert reconcile([line]) == {"od-1": (6.0, 6.0)}


def test_rows_split_owned_and_rented_spend_and_charge_idle_time_to_whoever_provisioned():
    table = {}
    for a in [
        attempt(user="ana", kind="local", hours=2),
        attempt(user="bob", kind="on_demand", node="od-1", hours=1, price=3),
    ]:
        add_entry(table, a, by="user_name")
    idle = idle_parts([lifetime(hours=2, price=3, user="ana")], {"od-1": Sums(seconds=3600, gpu_hours=1, cost=3)})
    assert [(p.node_id, p.cost, p.seconds) for p in idle] == [("od-1", 3.0, 3600)]
    by_user = {r.key: r for r in rows(table, idle, group_by="user")}
    assert (by_user["ana"].owned_cost, by_user["ana"].on_demand_cost, by_user["ana"].local_gpu_hours) == (2, 3, 2)
    assert (by_user["bob"].owned_cost, by_user["bob"].on_demand_cost, by_user["bob"].on_demand_nodes) == (0, 3, 1)
    [total] = rows(table, idle, group_by=None)
    assert (total.spend, total.on_demand_cost, total.on_demand_nodes) == (8, 6, 1)  # 6 = the node's lifetime


def test_owned_utilisation_is_busy_over_available_gpu_hours():
    usage = owned([lifetime("ws", kind="local", hours=10, gpus=2, price=0.5)], {"local": 5.0})
    assert (usage["local"].available_gpu_hours, usage["local"].utilisation, usage["local"].idle_gpu_hours) == (
        20,
        0.25,
        15,
    )
    assert usage["reserved"].utilisation is None
