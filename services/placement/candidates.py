"""A dry run: the places a job could go, with predicted duration and cost, per allowed node kind (pure)."""
from collections.abc import Iterable

from shared.jobs import Spec
from shared.nodes import NodeInfo
from shared.rpc import Candidate, CandidatesReply
from services.placement.adapter import DEFAULT_DURATION_S
from services.placement.fit import Usage, catalogue_node, fits
from services.placement.policy import InstanceType, JobRequest
from services.placement.policy.options import rent_cost

KINDS = {"local": ("local",), "cloud": ("reserved", "on_demand"), "any": ("local", "reserved", "on_demand")}


def _tflops(node: NodeInfo, gpus: int) -> float:
    per_gpu = sorted((g.tflops for g in node.gpus), reverse=True)[:max(gpus, 1)]
    return sum(per_gpu) / len(per_gpu) if per_gpu else 0.0


def _share(node: NodeInfo, gpus: int) -> float:
    """The part of a node's price one rank pays: by GPUs for GPU jobs, the whole node otherwise."""
    return node.price_per_hour * (gpus / len(node.gpus) if node.gpus and gpus else 1.0)


def candidates(
    *, spec: Spec, nodes: Iterable[NodeInfo], usage: dict[str, Usage], catalogue: Iterable[InstanceType],
    reference_tflops: float, predicted_s: float | None = None, known: Iterable[NodeInfo] | None = None,
) -> CandidatesReply:
    """The best node of each allowed kind (free now preferred), and every instance type that could be rented; a kind
    is unplaceable when no `known` node (lost ones included: they may come back) nor instance type could host it."""
    nodes = list(nodes)
    known = nodes if known is None else list(known)
    resource, prefs = spec.resource, spec.placement
    base = predicted_s or prefs.expected_duration_s or DEFAULT_DURATION_S
    source = "estimator" if predicted_s else "owner" if prefs.expected_duration_s else "default"
    models = set(prefs.gpu_models)
    out: list[Candidate] = []
    unplaceable: dict[str, str] = {}

    def offer(node: NodeInfo, *, free: bool, instance: InstanceType | None = None) -> Candidate:
        tflops = _tflops(node, resource.gpu_count)
        duration = base * reference_tflops / tflops if resource.gpu_count and tflops else base
        price = _share(node, resource.gpu_count) * resource.node_count
        cost = price * duration / 3600
        if instance is not None:  # a rental is the whole instance, billed from the request: as the policy prices it
            price = instance.price_per_hour * resource.node_count
            cost = rent_cost(JobRequest(id="dry-run", user="", submitted_at=0.0, expected_duration_s=base,
                                        node_count=resource.node_count), instance, duration)
        return Candidate(node_kind=node.kind, node_id=None if instance else node.node_id,
                         instance_type=instance.name if instance else node.labels.get("instance_type"),
                         gpu_model=node.gpus[0].model if node.gpus else "", gpus=resource.gpu_count,
                         price_per_hour=round(price, 6), predicted_duration_s=round(duration, 1),
                         duration_source=source, expected_cost=round(cost, 6), free_now=free,
                         startup_delay_s=instance.startup_delay_s if instance else 0)

    def acceptable(node: NodeInfo) -> bool:
        return (not models or all(g.model in models for g in node.gpus)) and fits(node, Usage(), resource) is not None

    for kind in KINDS[prefs.allowed]:
        hosts = [n for n in nodes if n.kind == kind and acceptable(n)]
        rentable = [i for i in catalogue if kind == "on_demand" and acceptable(catalogue_node(i))]
        if len(hosts) < resource.node_count and not rentable:
            if sum(1 for n in known if n.kind == kind and acceptable(n)) >= resource.node_count:
                continue  # enough such nodes, just not all ready now
            unplaceable[kind] = f"no {kind} node can host {resource.gpu_count} GPU(s) of at least " \
                                f"{resource.min_gpu_memory_gb:g} GB with {resource.cpu_count:g} CPUs and " \
                                f"{resource.memory_gb:g} GB"
            continue
        if len(hosts) >= resource.node_count:
            free = [n for n in hosts if fits(n, usage.get(n.node_id, Usage()), resource) is not None]
            best = min(free or hosts, key=lambda n: (-_tflops(n, resource.gpu_count), n.price_per_hour))
            out.append(offer(best, free=len(free) >= resource.node_count))
        for instance in rentable:
            out.append(offer(catalogue_node(instance), free=False, instance=instance))
    out.sort(key=lambda c: (c.expected_cost, c.predicted_duration_s))
    return CandidatesReply(candidates=out, unplaceable_kinds=unplaceable)
