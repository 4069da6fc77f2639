"""Flavors and pools (placement's catalogue), and what a flavor or pool in a job's body means."""
from fastapi import APIRouter, Depends, Request

from shared.bus import RPC_CATALOGUE
from shared.jobs import JobCreate
from shared.rpc import Catalogue, Flavor, Pool
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.errors import ApiError
from services.submitter.rpc import ask

router = APIRouter(tags=["flavors and pools"])


async def fetch(request: Request) -> Catalogue:
    return Catalogue.model_validate(await ask(request, RPC_CATALOGUE, {}))


@router.get("/v2/flavors", summary="Resource shapes a job may name with spec.resource.flavor_id")
async def list_flavors(request: Request, principal: Principal = Depends(authenticate)) -> dict:
    items: list[Flavor] = (await fetch(request)).flavors
    return {"count": len(items), "items": [f.model_dump() for f in items]}


@router.get("/v2/pools", summary="Named groups of nodes a job may be kept to with spec.resource.pool_id")
async def list_pools(request: Request, principal: Principal = Depends(authenticate)) -> dict:
    items: list[Pool] = (await fetch(request)).pools
    return {"count": len(items), "items": [p.model_dump() for p in items]}


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
