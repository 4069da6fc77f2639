"""The live fleet tells the policy which rented nodes are spot (so only jobs that checkpoint are placed there)."""

from services.placement.fleet import Fleet, FleetNode
from tests.factories import node
from tests.unit.placement.placement_factories import make_instance


def test_a_node_rented_from_a_spot_entry_is_a_spot_node_to_the_policy():
    catalogue = (make_instance(name="cloud.1gpu"), make_instance(name="cloud.1gpu.spot", spot=True))
    fleet = Fleet(store=None, provider=None, catalogue=catalogue)
    for name in ("cloud.1gpu", "cloud.1gpu.spot"):
        info = node(node_id=f"od-{name}", kind="on_demand")
        fleet.nodes[info.node_id] = FleetNode(
            node_id=info.node_id, info=info, state="ready", provisioned=True, instance_type=name
        )

    views = {n.id: n.spot for n in fleet.policy_nodes({})}

    assert views == {"od-cloud.1gpu": False, "od-cloud.1gpu.spot": True}
