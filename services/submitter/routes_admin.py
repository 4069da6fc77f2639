"""Everything around jobs: nodes, liveness (users and tokens: routes_users; usage and quotas: routes_billing)."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from shared import asking
from shared.bus import RPC_HEALTH, RPC_NODES, SERVICES
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import use_cases

router = APIRouter()


NODES_PAGE_MAX = 1000


@router.get("/v2/nodes", tags=["nodes"], summary="Registered nodes and their state, a page at a time")
async def nodes(
    request: Request,
    principal: Principal = Depends(authenticate),
    offset: Annotated[int, Query(ge=0, le=10**9, description="Nodes to skip, by node id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=NODES_PAGE_MAX, description="Nodes in this page.")] = 500,
) -> dict:
    """One page of the nodes by node id (`total` counts them all; `next_offset` is null on the last page), from
    the monitor's memory; a task of a project the caller is not in shows only in `other_tasks` (the admin sees
    all, and `claims_refused`: what the node's registration claimed beyond its record). Each GPU shows its
    utilisation, memory in use, power and temperature as the node's last heartbeat read them (null: not read)."""
    submitter = use_cases(request)
    answer = await submitter.requester.ask(RPC_NODES, {"offset": offset, "limit": limit})
    if isinstance(answer, list):  # a monitor from before paging answers every node
        answer = {"total": len(answer), "items": answer[offset : offset + limit]}
    records, total = answer["items"], answer["total"]
    owners = await submitter.repo.owners({t["job_id"] for r in records for t in r.get("running") or []})
    items = []
    for record in records:
        info, running = record.get("info") or {}, record.get("running") or []
        state = record["state"] if record["state"] == "lost" or not running else "busy"
        visible = [
            {**t, "project_id": owners.get(t["job_id"], "")}
            for t in running
            if principal.is_admin or owners.get(t["job_id"]) in principal.projects
        ]
        items.append(
            {
                **info,
                "gpus": gpu_views(info.get("gpus") or [], record.get("gpus") or []),
                "node_id": record["node_id"],
                "state": state,
                "last_seen": record["last_seen"],
                "running": visible,
                "other_tasks": len(running) - len(visible),
                "boot_id": record.get("boot_id", ""),
                **({"claims_refused": record.get("claims_refused") or {}} if principal.is_admin else {}),
            }
        )
    following = offset + len(items)
    return {
        "count": len(items),
        "total": total,
        "offset": offset,
        "limit": limit,
        "next_offset": following if following < total else None,
        "items": items,
    }


READINGS = ("util_percent", "memory_used_gb", "power_w", "temp_c")


def gpu_views(gpus: list[dict], readings: list[dict]) -> list[dict]:
    """Each GPU of the node's record with its last heartbeat's figures (None where the node did not read it): the
    GPU's own figures only, whoever runs on it."""
    by_index = {r.get("index"): r for r in readings}
    return [{**gpu, **{k: by_index.get(gpu.get("index"), {}).get(k) for k in READINGS}} for gpu in gpus]


@router.get("/healthz", tags=["health"], summary="Liveness of every service")
async def healthz(request: Request) -> JSONResponse:
    submitter = use_cases(request)

    async def probe(service: str) -> dict:
        try:
            # a service that has just started may not have subscribed yet: asked again while its 2 s last
            reply = await asking.request(submitter.requester.broker, {}, RPC_HEALTH.format(service=service), timeout=2)
            decoded = await reply.decode()
            return {"ok": True, **(decoded if isinstance(decoded, dict) else {})}
        except Exception as exc:
            return {"ok": False, "error": repr(exc)}

    async def database() -> dict:
        try:
            await submitter.repo.ping()
            return {"ok": True}
        except Exception as exc:
            return {"ok": False, "error": repr(exc)}

    bus_ping = asyncio.ensure_future(submitter.requester.broker.ping(timeout=2))  # asked alongside the others
    answers = await asyncio.gather(*(probe(s) for s in SERVICES), database())
    bus = await bus_ping
    services = {
        "submitter": {"ok": True},
        **dict(zip(SERVICES, answers[:-1])),
        "database": answers[-1],
        "bus": {"ok": bus},
    }
    ok = all(s["ok"] for s in services.values())
    return JSONResponse(
        status_code=200 if ok else 503, content={"status": "ok" if ok else "degraded", "services": services}
    )
