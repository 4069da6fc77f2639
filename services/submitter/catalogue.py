"""Placement's catalogue (flavors and pools), and what a flavor or pool named in a job's body means."""
from fastapi import Request

from shared.bus import RPC_CATALOGUE
from shared.jobs import JobCreate
from shared.rpc import Catalogue
from services.submitter import errors
from services.submitter.errors import ApiError
from services.submitter.rpc import ask


async def fetch(request: Request) -> Catalogue:
    """The flavors and pools placement knows."""
    return Catalogue.model_validate(await ask(request, RPC_CATALOGUE, {}))


async def resolve(request: Request, body: JobCreate) -> JobCreate:
    """A body naming a flavor gets the flavor's resources; a named pool must exist."""
    resource = body.spec.resource
    if not resource.flavor_id and not resource.pool_id:
        return body
    catalogue = await fetch(request)
    if resource.pool_id and resource.pool_id not in {p.pool_id for p in catalogue.pools}:
        raise ApiError(400, errors.PARAM_INVALID, f"param[spec.resource.pool_id] invalid: no pool "
                       f"{resource.pool_id!r} (GET /v2/pools lists them)")
    if not resource.flavor_id:
        return body
    flavor = next((f for f in catalogue.flavors if f.flavor_id == resource.flavor_id), None)
    if flavor is None:
        raise ApiError(400, errors.PARAM_INVALID, f"param[spec.resource.flavor_id] invalid: no flavor "
                       f"{resource.flavor_id!r} (GET /v2/flavors lists them)")
    if resource.node_count > flavor.max_node_count:
        raise ApiError(400, errors.PARAM_INVALID, f"param[spec.resource.node_count] invalid: flavor "
                       f"{flavor.flavor_id} allows at most {flavor.max_node_count} node(s)")
    sized = resource.model_copy(update={"gpu_count": flavor.gpu_count, "min_gpu_memory_gb": flavor.gpu_memory_gb,
                                        "cpu_count": flavor.cpu_count, "memory_gb": flavor.memory_gb})
    placement = body.spec.placement
    if flavor.gpu_model and not placement.gpu_models:
        placement = placement.model_copy(update={"gpu_models": [flavor.gpu_model]})
    spec = body.spec.model_copy(update={"resource": sized, "placement": placement})
    return body.model_copy(update={"spec": spec})
