"""Fail-over benchmark: how long each part of a replicated control plane is away when its process dies.

Starts a fresh stack with three NATS servers and two processes of every service (leader leases on), then SIGKILLs,
one at a time and without restarting them: the NATS server leading the jobs stream, the leading placement,
monitor, billing and estimator, and one API replica. Throughout, a prober asks the API for a job list every 0.1 s
(through whichever replica answers) and jobs keep being submitted. For each kill it reports how long the service's
waiting replica took to hold the lease, and how long until a job submitted just after the kill was Running
(accepted, admitted, placed and started: the control plane working again end to end); overall, the longest time
the API answered nothing, how many requests failed over to the other replica, and that every job completed once.
Run: `python -m bench.failover` (about two minutes on the 2-core VM).
"""

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import nats

from shared.bus import LEASES
from bench.submit import NOOP, TOKEN, cluster
from services.stack.processes import Stack, StackSettings, free_ports_at

LEASED = ("placement", "monitor", "billing", "estimator")
JOB = {**NOOP, "algorithm": {"command": "sleep 1"}}


class Replicas:
    """Both API replicas; a request goes to the first that answers. Counts what failed and the longest silence."""

    def __init__(self, port: int) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        self.clients = [
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}", headers=headers, timeout=5) for p in (port, port + 1)
        ]
        self.failed, self.last_answer, self.longest_silence = 0, time.monotonic(), 0.0

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response | None:
        for client in self.clients:
            try:
                response = await client.request(method, url, **kwargs)
            except httpx.TransportError:
                self.failed += 1
                continue
            if response.status_code >= 500:
                self.failed += 1
                continue
            now = time.monotonic()
            self.longest_silence = max(self.longest_silence, now - self.last_answer)
            self.last_answer = now
            return response
        return None

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


async def lease_holder(js, stack: Stack, service: str) -> str | None:
    try:
        entry = await js.get_last_msg(LEASES.name, f"$KV.tm_leaders.{service}")
    except nats.errors.Error:
        return None
    pid = int(json.loads(entry.data)["holder"].split(":")[1])
    return next((name for name, p in stack.processes.items() if p.pid == pid), None)


async def submit(api: Replicas, name: str, *, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = await api.request("POST", "/v2/bench/training-jobs", json={"metadata": {"name": name}, **JOB})
        if response is not None and response.status_code == 201:
            return response.json()["metadata"]["id"]
        if response is not None and response.status_code not in (429, 503):
            raise RuntimeError(f"job {name} refused: {response.status_code} {response.text[:300]}")
        await asyncio.sleep(0.1)
    raise TimeoutError(f"job {name} not accepted within {timeout_s:g} s")


async def running_after(api: Replicas, job_id: str, since: float, *, timeout_s: float = 120) -> float | None:
    while time.monotonic() - since < timeout_s:
        response = await api.request("GET", f"/v2/bench/training-jobs/{job_id}")
        if response is not None and response.json()["status"]["phase"] in ("Running", "Completed"):
            return round(time.monotonic() - since, 1)
        await asyncio.sleep(0.1)
    return None


async def run(stack: Stack, *, jobs: int) -> dict:
    api, nc = (
        Replicas(stack.settings.api_port),
        await nats.connect(
            stack.nats_url.split(","),
            user_credentials=str(stack.admin_creds()),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
        ),
    )
    js, stop, submitted, kills = nc.jetstream(), asyncio.Event(), [], {}

    async def probe() -> None:
        while not stop.is_set():
            await api.request("GET", "/v2/bench/training-jobs", params={"limit": 1})
            await asyncio.sleep(0.1)

    async def flow() -> None:
        for i in range(jobs):
            submitted.append(await submit(api, f"flow-{i}"))
            await asyncio.sleep(0.5)

    prober, flowing = asyncio.create_task(probe()), asyncio.create_task(flow())
    try:
        await asyncio.sleep(3)
        jobs_leader = (await js.stream_info("TM_JOBS")).cluster.leader
        victims = [(jobs_leader, None), *[(await lease_holder(js, stack, s), s) for s in LEASED], ("submitter", None)]
        for n, (victim, service) in enumerate(victims):
            stack.signal(victim, signal.SIGKILL)
            killed = time.monotonic()
            job_id = await submit(api, f"after-{n}")
            takeover = None
            if service:
                while await lease_holder(js, stack, service) in (None, victim):
                    if time.monotonic() - killed > 60:
                        raise TimeoutError(f"no replica of {service} took the lease within 60 s")
                    await asyncio.sleep(0.1)
                takeover = round(time.monotonic() - killed, 1)
            kills[victim] = {
                "lease_taken_over_s": takeover,
                "next_job_running_s": await running_after(api, job_id, killed),
            }
            submitted.append(job_id)
            await asyncio.sleep(2)
        await flowing
        deadline = time.monotonic() + 180
        phases: list[str] = []
        while time.monotonic() < deadline:
            answers = [await api.request("GET", f"/v2/bench/training-jobs/{j}") for j in submitted]
            phases = [a.json()["status"]["phase"] if a is not None else "unknown" for a in answers]
            if all(p in ("Completed", "Failed", "Terminated") for p in phases):
                break
            await asyncio.sleep(1)
        return {
            "kills": kills,
            "api_longest_silence_s": round(api.longest_silence, 2),
            "api_failed_requests": api.failed,
            "jobs": len(submitted),
            "jobs_completed": sum(p == "Completed" for p in phases),
        }
    finally:
        stop.set()
        prober.cancel()
        flowing.cancel()
        await api.close()
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=30, help="jobs submitted one every 0.5 s during the kills")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped from outside: the stack is stopped too
    with tempfile.TemporaryDirectory(prefix="tm-failover-") as tmp:
        data = Path(tmp)
        (data / "cluster.toml").write_text(cluster(3))
        stack = Stack(
            StackSettings(
                data_dir=data,
                nats_port=free_ports_at(0, 1, 2, 10, 11, 12),
                api_port=free_ports_at(0, 1),
                cluster_file=data / "cluster.toml",
                admin_token=TOKEN,
                mongo_url=None,
                log_level="WARNING",
                nats_servers=3,
                service_replicas=2,
            )
        )
        try:
            stack.start_all()
            time.sleep(5)  # every agent registered
            result = asyncio.run(run(stack, jobs=args.jobs))
        finally:
            stack.stop_all()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
