"""Placement's catalogue (flavors and pools), and what a flavor or pool named in a job's body means."""

from shared.bus import RPC_CATALOGUE
from shared.jobs import JobCreate
from shared.rpc import Catalogue
from services.submitter.refusals import Invalid
from services.submitter.rpc import Requester


async def fetch(requester: Requester) -> Catalogue:
    """The flavors and pools placement knows."""
    return Catalogue.model_validate(await requester.ask(RPC_CATALOGUE, {}))


async def resolve(requester: Requester, body: JobCreate) -> JobCreate:
    """A body naming a flavor gets the flavor's resources; a named pool must exist."""
    resource = body.spec.resource
    if not resource.flavor_id and not resource.pool_id:
        return body
    catalogue = await fetch(requester)
    if resource.pool_id and resource.pool_id not in {p.pool_id for p in catalogue.pools}:
        raise Invalid("spec.resource.pool_id", f"no pool {resource.pool_id!r} (GET /v2/pools lists them)")
    if not resource.flavor_id:
        return body
    flavor = next((f for f in catalogue.flavors if f.flavor_id == resource.flavor_id), None)
    if flavor is None:
        raise Invalid("spec.resource.flavor_id", f"no flavor {resource.flavor_id!r} (GET /v2/flavors lists them)")
    if resource.node_count > flavor.max_node_count:
        raise Invalid(
            "spec.resource.node_count", f"flavor {flavor.flavor_id} allows at most {flavor.max_node_count} node(s)"
        )
    sized = resource.model_copy(
        update={
            "gpu_count": flavor.gpu_count,
            "min_gpu_memory_gb": flavor.gpu_memory_gb,
            "cpu_count": flavor.cpu_count,
            "memory_gb": flavor.memory_gb,
        }
    )
    placement = body.spec.placement
    if flavor.gpu_model and not placement.gpu_models:
        placement = placement.model_copy(update={"gpu_models": [flavor.gpu_model]})
    spec = body.spec.model_copy(update={"resource": sized, "placement": placement})
    return body.model_copy(update={"spec": spec})
