"""/v2/flavors and /v2/pools: placement's catalogue, as a job's body may name it."""

from fastapi import APIRouter, Depends, Request

from shared.rpc import Flavor, Pool
from services.submitter.auth import Principal, authenticate
from services.submitter.catalogue import fetch
from services.submitter.deps import use_cases

router = APIRouter(tags=["flavors and pools"])


@router.get("/v2/flavors", summary="Resource shapes a job may name with spec.resource.flavor_id")
async def list_flavors(request: Request, principal: Principal = Depends(authenticate)) -> dict:
    items: list[Flavor] = (await fetch(use_cases(request).requester)).flavors
    return {"count": len(items), "items": [f.model_dump() for f in items]}


@router.get("/v2/pools", summary="Named groups of nodes a job may be kept to with spec.resource.pool_id")
async def list_pools(request: Request, principal: Principal = Depends(authenticate)) -> dict:
    items: list[Pool] = (await fetch(use_cases(request).requester)).pools
    return {"count": len(items), "items": [p.model_dump() for p in items]}
