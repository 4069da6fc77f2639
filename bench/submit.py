"""Submission benchmark: N no-op jobs through the REST API of a freshly started stack.

Reports jobs/s accepted by the API, submit→Running latency (p50/p99, from each job's create_time and
start_time), and the peak RSS of every process of the stack. Run: `make bench-submit` (or
`python -m bench.submit --jobs 200 --concurrency 8`).
"""
import argparse
import asyncio
import json
import platform
import socket
import tempfile
import time
from pathlib import Path

import httpx

from services.stack.processes import Stack, StackSettings

TOKEN = "bench-admin-token-0123456789abcdef0"  # 32+ characters, as the submitter requires


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(nodes: int) -> str:
    return "".join(
        f'[[nodes]]\nid = "bench-{i}"\nkind = "{("local", "reserved", "on_demand")[i % 3]}"\ncpu_count = 64\n'
        f'memory_gb = 256\nprice_per_hour = 1.0\n\n' for i in range(nodes)
    )


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run(stack: Stack, *, jobs: int, concurrency: int) -> dict:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) as api:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(jobs):
            queue.put_nowait(i)
        ids: list[str] = []

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                body = {"metadata": {"name": f"noop-{i}"}, "algorithm": {"command": "true"},
                        "spec": {"resource": {"cpu_count": 0.5, "memory_gb": 0.5}}}
                response = await api.post("/v2/bench/training-jobs", json=body)
                response.raise_for_status()
                ids.append(response.json()["metadata"]["id"])

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        accept_s = time.perf_counter() - started

        while True:
            page = (await api.get("/v2/bench/training-jobs", params={"limit": 500, "phase": ["Pending", "Creating",
                                                                                             "Running"]})).json()
            if page["total"] == 0:
                break
            if time.perf_counter() - started > 600:
                raise TimeoutError(f"{page['total']} jobs still not finished")
            await asyncio.sleep(0.5)
        finish_s = time.perf_counter() - started
        items = []
        for offset in range(0, jobs, 500):
            items += (await api.get("/v2/bench/training-jobs", params={"limit": 500, "offset": offset})).json()["items"]
    latencies = [(j["status"]["start_time"] - j["metadata"]["create_time"]) / 1000 for j in items
                 if j["status"]["start_time"]]
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "accepted_per_s": round(jobs / accept_s, 1),
        "all_finished_s": round(finish_s, 1),
        "completed": sum(j["status"]["phase"] == "Completed" for j in items),
        "submit_to_running_p50_s": round(percentile(latencies, 0.5), 3),
        "submit_to_running_p99_s": round(percentile(latencies, 0.99), 3),
        "peak_rss_mb": {name: round(peak_rss_mb(p.pid), 1) for name, p in sorted(stack.processes.items())},
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
        data = Path(tmp)
        (data / "cluster.toml").write_text(cluster(args.nodes))
        stack = Stack(StackSettings(data_dir=data, nats_port=free_port(),
                                    api_port=free_port(), cluster_file=data / "cluster.toml", admin_token=TOKEN,
                                    mongo_url=None, log_level="WARNING"))
        try:
            stack.start_all()
            time.sleep(3)  # let every agent register
            result = asyncio.run(run(stack, jobs=args.jobs, concurrency=args.concurrency))
        finally:
            stack.stop_all()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
