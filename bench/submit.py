"""Submission benchmark: N no-op jobs through the REST API of a freshly started stack.

Reports jobs/s accepted by the API, submit→Running latency (p50/p99, from each job's create_time and
start_time), the latency of a job-list page, the CPU seconds and peak RSS of every process of the stack, and the
machine's cores (and those this process may use); `--count-commands`
adds the database commands each process sent per job of the burst (counted by each process's client).
`--history N` first stores N finished jobs in the project (straight into the API's collections, each job and its
list entry, as months of use leave them), to show whether submitting and listing slow down as the history grows;
`--idle N` first runs N jobs one at a time (submit → Running on an idle stack). Run: `make bench-submit` (or
`python -m bench.submit --jobs 200 --concurrency 8 --history 5000 --idle 20`).
"""

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from pymongo import MongoClient

from shared.events import JobStatusChanged
from shared.jobs import JobCreate, Phase, SecondaryPhase
from shared.settings import database_name
from shared.store import COUNTS_DIR
from bench import cpuprofile, threadprofile
from bench.scale.probe import cpu_seconds, cpu_spent, machine, pace_ms
from services.stack.processes import Stack, StackSettings
from services.submitter.viewentries import list_entry
from services.submitter.views import new_job, status_fields

TOKEN = "bench-admin-token-0123456789abcdef0"  # 32+ characters, as the submitter requires
UNFINISHED = ["Pending", "Creating", "Running"]
API = "submitter"  # the process whose commands the bench's own polls add to


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(nodes: int) -> str:
    return "".join(
        f'[[nodes]]\nid = "bench-{i}"\nkind = "{("local", "reserved", "on_demand")[i % 3]}"\ncpu_count = 64\n'
        f"memory_gb = 256\nprice_per_hour = 1.0\n\n"
        for i in range(nodes)
    )


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def seed_history(stack: Stack, *, jobs: int, project: str = "bench") -> None:
    """N finished jobs of the project, stored as the API stores them (each job and its list entry; a finished job
    has no queue entry), written in bulk once the stack serves."""
    if not jobs:
        return
    now = datetime.now(UTC)
    docs = []
    for i in range(jobs):
        body = JobCreate.model_validate(
            {
                "metadata": {"name": f"history-{i}"},
                "algorithm": {"command": "true"},
                "spec": {"resource": {"cpu_count": 0.5, "memory_gb": 0.5}},
            }
        )
        doc = new_job(
            job_id=f"history-{i}", project_id=project, user_name="admin", now=now - timedelta(seconds=i), body=body
        )
        done = JobStatusChanged(
            event_id=f"history-{i}:status:4",
            job_id=doc["_id"],
            project_id=project,
            user_name="admin",
            version=4,
            phase=Phase.COMPLETED,
            secondary_phase=SecondaryPhase.COMPLETED,
            start_time=now,
            end_time=now,
        )
        for path, value in status_fields(done).items():
            *parents, leaf = path.split(".")
            target = doc
            for part in parents:
                target = target.setdefault(part, {})
            target[leaf] = value
        docs.append(doc)
    with MongoClient(stack.mongo_url_of("submitter"), tz_aware=True) as client:
        db = client[database_name("submitter")]
        for i in range(0, jobs, 1000):
            db.api_jobs.insert_many(docs[i : i + 1000])
            db.api_job_list.insert_many([list_entry(d) for d in docs[i : i + 1000]])  # what the API keeps beside


async def list_latency_ms(api: httpx.AsyncClient, *, samples: int = 10) -> float:
    """Median time of one page of the project's job list (what the portal and CLI ask for)."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        (await api.get("/v2/bench/training-jobs", params={"limit": 50})).raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return round(percentile(times, 0.5), 1)


FEW_LEFT = 25  # jobs still unfinished below which the burst's end is looked for every 50 ms
NOOP = {"algorithm": {"command": "true"}, "spec": {"resource": {"cpu_count": 0.5, "memory_gb": 0.5}}}


async def idle_latency(api: httpx.AsyncClient, *, jobs: int, prefix: str = "idle") -> dict:
    """Submit → Running of one job at a time on an idle stack: each submitted once the one before it finished
    (the stack's own create and start times, so the polling pace does not count)."""
    latencies, split = [], []
    for i in range(jobs):
        response = await api.post("/v2/bench/training-jobs", json={"metadata": {"name": f"{prefix}-{i}"}, **NOOP})
        response.raise_for_status()
        job_id = response.json()["metadata"]["id"]
        for _ in range(3000):
            job = (await api.get(f"/v2/bench/training-jobs/{job_id}")).json()
            if job["status"]["phase"] in ("Completed", "Failed", "Terminated"):
                break
            await asyncio.sleep(0.02)
        if job["status"]["start_time"]:
            latencies.append((job["status"]["start_time"] - job["metadata"]["create_time"]) / 1000)
            split.append(phases_of(i, job))
    return (
        {
            "idle_jobs": jobs,
            "idle_submit_to_running_p50_s": round(percentile(latencies, 0.5), 3),
            "idle_submit_to_running_p99_s": round(percentile(latencies, 0.99), 3),
            "idle_slowest": sorted(split, key=lambda s: -s["submit_to_running_s"])[:3],
        }
        if latencies
        else {}
    )


def phases_of(i: int, job: dict) -> dict:
    """Where the `i`th job's submit → Running went: to its first placement, then to its start (the platform's own
    times), and on which node."""
    created, started = job["metadata"]["create_time"], job["status"]["start_time"]
    first = (job["status"].get("attempts") or [{}])[0]
    placed = first.get("placed_at") or started
    return {
        "job": i,
        "submit_to_running_s": (started - created) / 1000,
        "to_placed_s": (placed - created) / 1000,
        "placed_to_running_s": (started - placed) / 1000,
        "node": ",".join(first.get("node_ids", [])),
    }


async def submit_noop(api: httpx.AsyncClient, i: int, refused: list[int]) -> httpx.Response:
    """Submit no-op job `noop-<i>`, again after each 429 or 503 (said so, nothing stored: a client tries again),
    whose status codes go to `refused`."""
    body = {"metadata": {"name": f"noop-{i}"}, **NOOP}
    while (response := await api.post("/v2/bench/training-jobs", json=body)).status_code in (429, 503):
        refused.append(response.status_code)
        await asyncio.sleep(float(response.headers.get("retry-after", 0.5)))
    return response.raise_for_status()


def bench_settings(data: Path, *, cluster_file: Path | None = None, **more: Any) -> StackSettings:
    """A bench stack's settings: its state under `data`, free ports, the embedded databases, warnings only; its
    nodes in `cluster_file` (`data`/cluster.toml by default); `more` settings as given."""
    return StackSettings(
        data_dir=data,
        nats_port=free_port(),
        api_port=free_port(),
        cluster_file=cluster_file or data / "cluster.toml",
        admin_token=TOKEN,
        mongo_url=None,
        log_level="WARNING",
        **more,
    )


async def run(
    stack: Stack,
    *,
    jobs: int,
    concurrency: int,
    idle: int = 0,
    idle_at_start: bool = False,
    profile: Path | None = None,
    thread_profile: Path | None = None,
) -> dict:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) as api:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(jobs):
            queue.put_nowait(i)
        ids: list[str] = []
        refused: list[int] = []
        polls = 0  # the bench's own "all done yet?" pages over the burst

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                ids.append((await submit_noop(api, i, refused)).json()["metadata"]["id"])

        # right after start (as a user meets it; the estimator serves the shipped history model from its start)
        at_start = (
            {f"{k}_at_start": v for k, v in (await idle_latency(api, jobs=idle, prefix="idle-at-start")).items()}
            if idle and idle_at_start
            else {}
        )
        if at_start:
            print(json.dumps(at_start), file=sys.stderr, flush=True)  # a long run's first figures, kept
        await history_model_trained(api)
        list_ms = await list_latency_ms(api)
        idle_figures = await idle_latency(api, jobs=idle) if idle else {}
        before = await command_counts(stack)
        pids = {name: p.pid for name, p in stack.processes.items()} | {"bench": os.getpid()}
        bus_before = await cpuprofile.bus_counts(stack.nats_url, stack.admin_creds()) if profile else {}
        python = {name: pid for name, pid in pids.items() if name not in stack.nats_servers and name != "bench"}
        pace_before = pace_ms()  # outside the profiled window: its loop blocks this process for about a second
        samplers = cpuprofile.start(python, profile) if profile else {}
        if thread_profile:
            threadprofile.start(python)
        cpu_before = cpu_seconds(pids)
        started = time.perf_counter()
        try:
            await asyncio.gather(*(client() for _ in range(concurrency)))
            accept_s = time.perf_counter() - started

            while True:
                polls += 1
                page = (await api.get("/v2/bench/training-jobs", params={"limit": 1, "phase": UNFINISHED})).json()
                if page["total"] == 0:
                    break
                if time.perf_counter() - started > 600:
                    raise TimeoutError(f"{page['total']} jobs still not finished")
                # Looked at twice a second, and every 50 ms once few are left: the burst's end is seen within 50 ms
                # of the API showing it (a look every 0.5 s read it up to 0.5 s late, 4% of a 12 s burst).
                await asyncio.sleep(0.5 if page["total"] > FEW_LEFT else 0.05)
            finish_s = time.perf_counter() - started
            cpu_over_burst = cpu_spent(cpu_before, cpu_seconds(pids))
        finally:  # the samplers write their files as they stop, and none is left running on a failure
            cpuprofile.stop(samplers)
            written = threadprofile.stop(python, thread_profile) if thread_profile else {}
        pace_after = pace_ms()
        profiled = await profile_figures(stack, samplers, bus_before, cpu_over_burst, folder=profile, jobs=jobs)
        if thread_profile:
            profiled["thread_profile"] = {name: threadprofile.summarize(path) for name, path in sorted(written.items())}
        after = await command_counts(stack)
        per_job = commands_per_job(before, after, jobs=jobs, bench=polls * await poll_commands(api, stack, after))
        items, offset = [], 0
        while page := (await api.get("/v2/bench/training-jobs", params={"limit": 500, "offset": offset})).json()[
            "items"
        ]:
            items += [j for j in page if j["metadata"]["name"].startswith("noop-")]
            offset += len(page)
    latencies = [
        (j["status"]["start_time"] - j["metadata"]["create_time"]) / 1000 for j in items if j["status"]["start_time"]
    ]
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "accepted_per_s": round(jobs / accept_s, 1),
        "refused_then_retried": {code: refused.count(code) for code in sorted(set(refused))},
        "all_finished_s": round(finish_s, 1),
        "completed": sum(j["status"]["phase"] == "Completed" for j in items),
        "list_page_ms": list_ms,
        "submit_to_running_p50_s": round(percentile(latencies, 0.5), 3),
        "submit_to_running_p99_s": round(percentile(latencies, 0.99), 3),
        **at_start,
        **idle_figures,
        **per_job,
        "cpu_s_over_burst": cpu_over_burst,
        **profiled,
        "peak_rss_mb": {name: round(peak_rss_mb(p.pid), 1) for name, p in sorted(stack.processes.items())},
        "machine": {**machine(), "pace_ms_before": pace_before, "pace_ms_after": pace_after},
    }


async def profile_figures(
    stack: Stack, samplers: dict, bus_before: dict, cpu: dict[str, float], *, folder: Path | None, jobs: int
) -> dict:
    """With `--profile`: each process's CPU per job by kind and by purpose (py-spy's samples over the burst, the
    samplers stopped) and the bus messages a job cost."""
    if folder is None:
        return {}
    where = {
        name: cpuprofile.summarize(cpuprofile.read_samples(folder / f"{name}.txt"), cpu_s=cpu[name], jobs=jobs)
        for name in samplers
        if (folder / f"{name}.txt").exists()
    }
    bus = cpuprofile.per_job(bus_before, await cpuprofile.bus_counts(stack.nats_url, stack.admin_creds()), jobs=jobs)
    return {"cpu_per_job": where, "bus_messages_per_job": bus}


async def history_model_trained(api: httpx.AsyncClient, *, timeout_s: float = 600, patience_s: float = 15) -> None:
    """Wait until the estimator serves a history model and trains none: a fresh stack serves the shipped one, and
    trains one at its first start only where that cannot be served (CPU that is not the jobs'). One that serves none
    and trains nothing for `patience_s` has no logs beside the project and trains none (asked of its health, so
    torch stays out of here)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        answer = await api.get("/healthz")
        details = answer.json().get("services", {}).get("estimator", {}).get("details", {}) if answer.is_success else {}
        model = details.get("history_model", {})
        if model.get("version") is not None and not model.get("training"):
            return
        if model.get("version") is None and model.get("training") is False and time.monotonic() - started > patience_s:
            return
        await asyncio.sleep(1)
    # the burst goes on, but its figures then share the CPU with the training: say so where they are read
    print(f"warning: the estimator's history model was still training after {timeout_s:.0f} s", file=sys.stderr)


async def command_counts(stack: Stack) -> dict[str, Counter]:
    """What each process of the stack has sent to the database so far, by process name (empty when not counted)."""
    folder = stack.extra_env.get(COUNTS_DIR)
    if not folder:
        return {}
    await asyncio.sleep(1.5)  # each process writes its counts at most once a second
    names = {p.pid: name for name, p in stack.processes.items()}
    counts: dict[str, Counter] = {}
    for path in Path(folder).glob("*.json"):
        name = names.get(int(path.stem), path.stem)
        counts[name] = Counter(json.loads(path.read_text())["sent"])
    return counts


async def poll_commands(api: httpx.AsyncClient, stack: Stack, counted: dict[str, Counter], *, polls: int = 5) -> float:
    """The database commands one of the bench's "all done yet?" pages costs the API (a count, a page of one job
    and that job read), measured on `polls` such pages after the burst (0 when not counted)."""
    if not counted:
        return 0.0
    for _ in range(polls):
        await api.get("/v2/bench/training-jobs", params={"limit": 1, "phase": ["Completed"]})
    again = await command_counts(stack)
    return (sum(again.get(API, Counter()).values()) - sum(counted.get(API, Counter()).values())) / polls


def commands_per_job(before: dict[str, Counter], after: dict[str, Counter], *, jobs: int, bench: float = 0.0) -> dict:
    """Database commands per job of the burst, by process and in all, and the commands each process sent most
    (the background work of the burst's duration, relays and timers, is counted in): every command a process
    sent at least once every 20 jobs. `bench`: the commands the bench's own polls cost the API, left out of the
    API's figure and of the whole (its kinds in `_top` still hold them), reported apart."""
    if not after:
        return {}
    spent = {name: after[name] - before.get(name, Counter()) for name in after}
    by_process = {
        name: round((sum(c.values()) - (bench if name == API else 0)) / jobs, 2)
        for name, c in sorted(spent.items())
        if c
    }
    top = {
        name: {k: round(v / jobs, 2) for k, v in c.most_common() if v / jobs >= 0.05}
        for name, c in sorted(spent.items())
        if c
    }
    return {
        "db_commands_per_job": round(sum(by_process.values()), 1),
        "db_commands_per_job_by_process": by_process,
        "db_commands_per_job_top": top,
        "db_commands_per_job_bench_polls": round(bench / jobs, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--history", type=int, default=0, help="finished jobs stored in the project first")
    parser.add_argument("--idle", type=int, default=0, help="first, this many jobs one at a time (idle latency)")
    parser.add_argument(
        "--idle-at-start",
        action="store_true",
        help="the idle jobs also right after start (idle_*_at_start), before the history model is waited for",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--count-commands", action="store_true", help="database commands per job, by process")
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample every Python process with py-spy over the burst into this folder (pip install py-spy): "
        "CPU per job by kind and purpose, and bus messages per job",
    )
    parser.add_argument(
        "--thread-profile",
        type=Path,
        help="profile each Python process's main thread by its own CPU over the burst (cProfile, no extra tool) into "
        "this folder: shares by library and the functions that hold it (bench/threadprofile.py)",
    )
    parser.add_argument(
        "--no-history-model",
        action="store_true",
        help="the estimator serves and trains no history model "
        "(neither the shipped one nor MLPerf logs): counts and timings without the prior's work",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
        data = Path(tmp)
        (data / "cluster.toml").write_text(cluster(args.nodes))
        stack = Stack(bench_settings(data))
        if args.no_history_model:
            stack.extra_env["TRAINMASTER_MLPERF_DIR"] = str(data / "no-mlperf-logs")
            stack.extra_env["TRAINMASTER_SHIPPED_MODEL"] = str(data / "no-shipped-model")
        if args.thread_profile:
            stack.extra_env |= threadprofile.env(args.thread_profile, stack.env()["PYTHONPATH"])
            stack.settings.fork_server = False  # each process loads the profiling site itself as it starts
        if args.count_commands:
            (data / "db-commands").mkdir()
            stack.extra_env[COUNTS_DIR] = str(data / "db-commands")
        try:
            stack.start_all()
            seed_history(stack, jobs=args.history)
            time.sleep(3)  # let every agent register
            result = {
                "history": args.history,
                **asyncio.run(
                    run(
                        stack,
                        jobs=args.jobs,
                        concurrency=args.concurrency,
                        idle=args.idle,
                        idle_at_start=args.idle_at_start,
                        profile=args.profile,
                        thread_profile=args.thread_profile,
                    )
                ),
            }
        finally:
            stack.stop_all()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
