"""The tags placement's EC2 provider puts on every instance it launches, the labels and name its Kubernetes provider
gives every Pod, by which the minter (asking the cloud with its own read-only credentials) tells the platform's
machines: one definition, so the two never disagree on a name (a minter looking for another would revoke every
rented node)."""

TAG_CLUSTER = "trainmaster:cluster"
TAG_NODE = "trainmaster:node-id"
TAG_JOB = "trainmaster:job"
TAG_TYPE = "trainmaster:instance-type"
LABEL_CLUSTER = "trainmaster.io/cluster"
LABEL_NODE = "trainmaster.io/node-id"


def pod_name(node_id: str) -> str:
    """The name of a node's Pod (unique in its namespace: one Pod speaks for a node)."""
    return f"tm-{node_id.lower().replace('_', '-')}"[:63].rstrip("-")
