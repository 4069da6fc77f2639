"""Flavors and pools: what a job may name instead of raw resources, and which groups of nodes exist (pure)."""
from collections.abc import Iterable, Mapping
from typing import Any

from shared.nodes import NodeInfo
from shared.rpc import Catalogue, Flavor, Pool
from services.placement.policy import InstanceType


def flavors(nodes: Iterable[NodeInfo], catalogue: Iterable[InstanceType], declared: Iterable[Mapping[str, Any]]):
    """The cluster file's [[flavors]]; without any, one per shape of node the fleet has or may rent."""
    declared = list(declared)
    if declared:
        return [Flavor(**{k: v for k, v in f.items() if k in Flavor.model_fields}) for f in declared]
    shapes: dict[tuple, Flavor] = {}
    for node in nodes:
        gpu = node.gpus[0] if node.gpus else None
        key = (gpu.model if gpu else "cpu", len(node.gpus))
        flavor = shapes.get(key)
        if flavor is None:
            shapes[key] = Flavor(flavor_id=_name(key), gpu_model=key[0] if gpu else "", gpu_count=len(node.gpus),
                                 gpu_memory_gb=min((g.memory_gb for g in node.gpus), default=0),
                                 tflops=gpu.tflops if gpu else 0, cpu_count=node.cpu_count,
                                 memory_gb=node.memory_gb, price_per_hour=node.price_per_hour, max_node_count=1)
        else:
            shapes[key] = flavor.model_copy(update={"max_node_count": flavor.max_node_count + 1,
                                                    "price_per_hour": min(flavor.price_per_hour or 0,
                                                                          node.price_per_hour)})
    for it in catalogue:
        key = (it.gpu_model, it.gpus)
        if key not in shapes:
            shapes[key] = Flavor(flavor_id=_name(key), gpu_model=it.gpu_model, gpu_count=it.gpus,
                                 gpu_memory_gb=it.gpu_memory_gb, tflops=it.tflops, cpu_count=it.cpu,
                                 memory_gb=it.memory_gb, price_per_hour=it.price_per_hour, max_node_count=64)
    return sorted(shapes.values(), key=lambda f: f.flavor_id)


def pools(nodes: Iterable[NodeInfo]) -> list[Pool]:
    groups: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        groups.setdefault(node.labels.get("pool", "default"), []).append(node)
    return [Pool(pool_id=name, node_ids=sorted(n.node_id for n in members),
                 kinds=sorted({n.kind for n in members}), gpus=sum(len(n.gpus) for n in members))
            for name, members in sorted(groups.items())]


def catalogue(nodes: list[NodeInfo], instance_types: Iterable[InstanceType], declared) -> Catalogue:
    return Catalogue(flavors=flavors(nodes, instance_types, declared), pools=pools(nodes))


def _name(key: tuple) -> str:
    model, count = key
    return f"{model.lower().replace(' ', '-')}.{count}x" if count else "cpu"
