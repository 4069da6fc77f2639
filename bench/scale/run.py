"""One scale run: a fresh stack without agents, N simulated nodes, a steady window, then a burst of jobs."""

import asyncio
import logging
import os
import time
from pathlib import Path

import httpx

from shared.buscreds import write_secret
from shared.store import COUNTS_DIR
from bench.scale.probe import CpuWindow, Watch, cpu_seconds, cpu_spent, machine, percentile, rss_mb
from bench.scale.sim import IDENTITY, SimFleet, cluster_records, permissions
from bench.submit import TOKEN, bench_settings, command_counts, history_model_trained
from services.stack.processes import SERVICES, Stack, wait_for_port

log = logging.getLogger(__name__)
PROJECT = "scale"


def start_stack(
    data: Path, *, interval_s: float, timeout_s: float, nodes: int = 0, count_commands: bool = False
) -> Stack:
    """NATS, the database and the five services; no agent (the simulated fleet of `nodes` is the only one, each a
    record of the cluster file). `count_commands`: each process counts its database commands
    (`shared.store.CommandCounts`)."""
    (data / "cluster.toml").write_text("# the scale benchmark's nodes are simulated\n" + cluster_records(nodes))
    stack = Stack(
        bench_settings(
            data / "data",
            cluster_file=data / "cluster.toml",
            heartbeat_interval_s=interval_s,
            node_timeout_s=timeout_s,
            fork_server=False,  # each process's RSS its own, as in the reports before the fork server
        )
    )
    # no-op jobs need no history model: without the MLPerf logs the estimator trains none, and the minutes of CPU a
    # fresh stack's first training takes are not the control plane's
    stack.extra_env["TRAINMASTER_MLPERF_DIR"] = str(data / "no-mlperf-logs")
    if count_commands:
        (data / "db-commands").mkdir()
        stack.extra_env[COUNTS_DIR] = str(data / "db-commands")
    stack.start_nats()
    stack.start_database()
    stack.prepare_bus()
    stack.start_minter()  # placement asks it for rented nodes' identities, as under `make run`
    for name in SERVICES:
        stack.start_service(name)
    wait_for_port(stack.settings.api_port, timeout_s=60)
    return stack


def bench_creds(stack: Stack) -> Path:
    """The bench's own identity (`sim.permissions`), minted with the stack's keys; no service knows of it."""
    _, text = stack.identities.minter().mint(name=IDENTITY, permissions=permissions())
    return write_secret(stack.data_dir / "bus" / "creds" / f"{IDENTITY}.creds", text)


async def node_states(api: httpx.AsyncClient) -> dict[str, str]:
    states, offset = {}, 0
    while offset is not None:
        answer = await api.get("/v2/nodes", params={"limit": 1000, "offset": offset})
        if not answer.is_success:
            await asyncio.sleep(1)
            continue
        page = answer.json()
        states.update({n["node_id"]: n["state"] for n in page["items"]})
        offset = page["next_offset"]
    return states


async def nodes_latency(api: httpx.AsyncClient, *, samples: int, spread_s: float) -> tuple[list[float], int]:
    """Latencies of `GET /v2/nodes?limit=100` spread over the window, and how many failed (503: no answer)."""
    timings, failed = [], 0
    for _ in range(samples):
        t = time.perf_counter()
        if (await api.get("/v2/nodes", params={"limit": 100})).is_success:
            timings.append(time.perf_counter() - t)
        else:
            failed += 1
        await asyncio.sleep(spread_s / samples)
    return timings, failed


async def burst(api: httpx.AsyncClient, *, jobs: int, clients: int, timeout_s: float) -> dict:
    """`jobs` one-GPU no-op jobs from `clients` concurrent clients; wait until every one has ended. Bounded: no
    job is submitted, and none waited for, after `timeout_s` (what was not submitted by then counts as not done)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)
    submitted = []

    async def client() -> None:
        while not queue.empty() and time.perf_counter() - started < timeout_s:
            i = queue.get_nowait()
            body = {
                "metadata": {"name": f"scale-{i}"},
                "algorithm": {"command": "true"},
                "spec": {"resource": {"gpu_count": 1, "cpu_count": 1, "memory_gb": 1}},
            }
            (await api.post(f"/v2/{PROJECT}/training-jobs", json=body)).raise_for_status()
            submitted.append(i)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    accept_s = time.perf_counter() - started
    while time.perf_counter() - started < timeout_s:
        page = (
            await api.get(
                f"/v2/{PROJECT}/training-jobs", params={"limit": 1, "phase": ["Pending", "Creating", "Running"]}
            )
        ).json()
        if page["total"] == 0:
            break
        await asyncio.sleep(0.5)
    finish_s = time.perf_counter() - started
    items = []
    for offset in range(0, jobs, 500):
        page = await api.get(f"/v2/{PROJECT}/training-jobs", params={"limit": 500, "offset": offset})
        items += page.json()["items"]
    latencies = [
        (j["status"]["start_time"] - j["metadata"]["create_time"]) / 1000
        for j in items
        if j["status"].get("start_time")
    ]
    # Where the wait is: before placement decides (the queue), or between the decision and the task's start.
    first = [(j["metadata"]["create_time"], j["status"]["attempts"][0]) for j in items if j["status"].get("attempts")]
    to_placed = [(a["placed_at"] - created) / 1000 for created, a in first]
    placed_to_running = [(a["start_time"] - a["placed_at"]) / 1000 for _, a in first if a.get("start_time")]
    completed = sum(j["status"]["phase"] == "Completed" for j in items)
    return {
        "jobs": jobs,
        "jobs_submitted": len(submitted),
        "jobs_completed": completed,
        "accepted_per_s": round(len(submitted) / accept_s, 1),
        "jobs_per_s": round(completed / finish_s, 2),
        "burst_s": round(finish_s, 1),
        "submit_to_running_p50_s": _round(percentile(latencies, 0.5)),
        "submit_to_running_p95_s": _round(percentile(latencies, 0.95)),
        "submit_to_placed_p50_s": _round(percentile(to_placed, 0.5)),
        "submit_to_placed_p95_s": _round(percentile(to_placed, 0.95)),
        "placed_to_running_p50_s": _round(percentile(placed_to_running, 0.5)),
        "placed_to_running_p95_s": _round(percentile(placed_to_running, 0.95)),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def measure(
    stack: Stack,
    *,
    nodes: int,
    seconds: float,
    jobs: int,
    interval_s: float,
    task_s: float,
    ready_timeout_s: float,
    jobs_timeout_s: float,
) -> dict:
    creds = bench_creds(stack)
    output = stack.data_dir / "sim-output"
    output.mkdir(exist_ok=True)
    fleet = SimFleet(stack.nats_url, creds, nodes, interval_s=interval_s, task_s=task_s, output_dir=output)
    watch = Watch(stack.nats_url, stack.admin_creds())
    await watch.open()
    await fleet.open()
    pids = {name: p.pid for name, p in stack.processes.items()} | {"bench": os.getpid()}
    loops = [asyncio.create_task(watch.lag_forever())]
    cpu_at_start = cpu_seconds(pids)
    t0 = time.monotonic()
    try:
        await fleet.register_all()
        log.info("%d nodes registered after %.1f s", nodes, time.monotonic() - t0)
        loops += [asyncio.create_task(fleet.heartbeat_forever()), asyncio.create_task(fleet.answer_commands())]
        sims = set(fleet.agents)
        while len(sims & watch.ready_at.keys()) < nodes and time.monotonic() - t0 < ready_timeout_s:
            await asyncio.sleep(0.5)
        all_ready_s = max((watch.ready_at[n] for n in sims & watch.ready_at.keys()), default=t0) - t0
        log.info("%d of %d nodes ready after %.1f s", len(sims & watch.ready_at.keys()), nodes, all_ready_s)
        cpu = CpuWindow(pids)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) as api:
            latency, latency_failed = await nodes_latency(api, samples=20, spread_s=seconds)
            steady_cpu = cpu.percent()
            counted = await command_counts(stack)
            log.info(
                "steady window over: %d heartbeats sent, %d nodes lost, monitor %s",
                sum(a.heartbeats for a in fleet.agents.values()),
                len(watch.lost),
                watch.monitor_details,
            )
            states = await node_states(api)
            if jobs:
                await history_model_trained(api)  # a fresh stack's first training would share the burst's CPU
            result = await burst(api, jobs=jobs, clients=8, timeout_s=jobs_timeout_s) if jobs else {}
    finally:
        lost = list(watch.lost)  # what comes after the simulated nodes stop is no loss to count
        for loop in loops:
            if loop.done() and loop.exception():
                log.error("bench loop %s failed: %r", loop.get_coro().__qualname__, loop.exception())
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for closing in (watch.close(), fleet.close()):
            try:
                await asyncio.wait_for(closing, timeout=10)
            except (TimeoutError, OSError) as exc:
                log.warning("closing: %r", exc)
    cpu_over_run = cpu_spent(cpu_at_start, cpu_seconds(pids))
    ready = sum(states.get(n) in ("ready", "busy") for n in sims)
    timeout_s = max(stack.settings.node_timeout_s, fleet.pace.timeout_s or 0.0)  # as announced for the fleet
    false = [
        (n, at)
        for n, at in lost
        if n in fleet.agents and fleet.spoke_within(n, start=at - timeout_s + 1.0, end=at - 1.0)
    ]
    return {
        "nodes": nodes,
        "seconds": seconds,
        "heartbeat_interval_s": interval_s,
        "heartbeat_interval_announced_s": fleet.pace.interval_s,
        "node_timeout_announced_s": fleet.pace.timeout_s,
        "nodes_ready": ready,
        "all_ready_s": round(all_ready_s, 1) if ready == nodes else None,
        # A loss is false when the node was speaking: the bench sent one of its heartbeats within the node timeout
        # before the loss was announced (less a second for the heartbeat to arrive). A node the bench itself left
        # silent that long (its own send lag) is lost for real.
        "false_lost": len(false),
        "false_lost_nodes": len({n for n, _ in false}),
        "lost_while_silent": len(lost) - len(false),
        "max_lag": max([*watch.max_lag.values(), watch.heartbeat_backlog_max], default=0),
        "lag_by_consumer": watch.max_lag,
        "heartbeat_backlog_max": watch.heartbeat_backlog_max,
        "bench_send_lag_max_s": round(fleet.send_lag_max_s, 3),
        "heartbeats_sent": sum(a.heartbeats for a in fleet.agents.values()),
        "monitor_health": watch.monitor_details,
        "nodes_limit100_p50_ms": _round(1000 * percentile(latency, 0.5)) if latency else None,
        "nodes_limit100_p95_ms": _round(1000 * percentile(latency, 0.95)) if latency else None,
        "nodes_limit100_failed": latency_failed,
        **({"jobs": 0, "jobs_completed": 0, "jobs_per_s": None, "submit_to_running_p95_s": None} | result),
        "cpu_percent_steady": steady_cpu,
        "cpu_s_over_run": cpu_over_run,
        **(
            {
                "db_commands_per_node_registered": {
                    name: round(sum(c.values()) / nodes, 2) for name, c in sorted(counted.items())
                }
            }
            if counted
            else {}
        ),
        "rss_mb": {name: rss_mb(pid) for name, pid in pids.items()},
        "peak_rss_mb": {name: rss_mb(pid, "VmHWM") for name, pid in pids.items()},
        "machine": machine(),
    }
