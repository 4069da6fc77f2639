"""What one rank pays for its part of a node: the one rule behind the price placement shows and decides (a dry
run, the choice among nodes) and the price billing charges an attempt, so the two never differ."""


def rank_price_per_hour(node_price: float, *, gpus: int, node_gpus: int) -> float:
    """Its GPUs' share of the node's price per hour (attempts side by side on one node together pay it once); the
    whole node for a rank without GPUs (it takes the node) or on a node whose GPU count is unknown."""
    return node_price * (min(gpus, node_gpus) / node_gpus if gpus and node_gpus else 1.0)
