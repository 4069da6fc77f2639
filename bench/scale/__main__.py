"""Scale benchmark: N simulated agents (the agent's own message code, one process) against a fresh stack.

`python -m bench.scale --nodes N --seconds S --jobs J --json` prints one JSON object; `--sweep 500,1000,...`
runs each fleet size on its own fresh stack and prints a Markdown table (`make bench-scale`; `--quick`: 500 and
1,000 nodes, 30 s, 100 jobs). Each run is bounded: registration and readiness (`--ready-timeout`), the steady
window (`--seconds`), the job burst (`--jobs-timeout`).
"""

import argparse
import asyncio
import json
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from bench.scale.run import measure, start_stack

COLUMNS = (
    ("nodes", "nodes"),
    ("nodes_ready", "ready"),
    ("all_ready_s", "all ready after (s)"),
    ("false_lost", "false losses"),
    ("heartbeat_interval_announced_s", "heartbeat interval told (s)"),
    ("max_lag", "max lag (msgs)"),
    ("nodes_limit100_p95_ms", "GET /v2/nodes?limit=100 p95 (ms)"),
    ("jobs_completed", "jobs done"),
    ("jobs_per_s", "jobs/s"),
    ("submit_to_running_p50_s", "submit→Running p50 (s)"),
    ("submit_to_running_p95_s", "p95 (s)"),
    ("monitor_cpu", "monitor CPU %"),
    ("monitor_rss", "monitor RSS MB"),
    ("nats_cpu", "nats CPU %"),
    ("database_cpu", "database CPU %"),
)


def one(args: argparse.Namespace, nodes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tm-scale-") as tmp:
        stack = start_stack(
            Path(tmp), interval_s=args.interval, timeout_s=args.timeout, nodes=nodes, count_commands=args.count_commands
        )
        try:
            return asyncio.run(
                measure(
                    stack,
                    nodes=nodes,
                    seconds=args.seconds,
                    jobs=args.jobs,
                    interval_s=args.interval,
                    task_s=args.task_s,
                    ready_timeout_s=args.ready_timeout,
                    jobs_timeout_s=args.jobs_timeout,
                )
            )
        finally:
            stack.stop_all()
            if args.logs:
                shutil.copytree(stack.data_dir / "logs", Path(args.logs) / f"{nodes}", dirs_exist_ok=True)


def database_cpu(cpu: dict) -> float | None:
    """The database servers' CPU together (one per service, `database-<service>`)."""
    shares = [v for name, v in cpu.items() if name.startswith("database-")]
    return round(sum(shares), 1) if shares else None


def row(result: dict) -> str:
    flat = {
        **result,
        "monitor_cpu": result["cpu_percent_steady"].get("monitor"),
        "monitor_rss": result["peak_rss_mb"].get("monitor"),
        "nats_cpu": result["cpu_percent_steady"].get("nats"),
        "database_cpu": database_cpu(result["cpu_percent_steady"]),
    }
    return "| " + " | ".join("—" if flat.get(k) is None else str(flat[k]) for k, _ in COLUMNS) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--sweep", default="", help="comma-separated fleet sizes, one fresh stack each")
    parser.add_argument("--quick", action="store_true", help="500 and 1,000 nodes, 30 s, 100 jobs")
    parser.add_argument("--seconds", type=float, default=60, help="steady heartbeating window")
    parser.add_argument("--jobs", type=int, default=500, help="burst of one-GPU no-op jobs (0: none)")
    parser.add_argument("--interval", type=float, default=2.0, help="heartbeat interval (s)")
    parser.add_argument("--timeout", type=float, default=10.0, help="node timeout (s)")
    parser.add_argument("--task-s", type=float, default=0.2, help="how long a simulated task runs")
    parser.add_argument("--ready-timeout", type=float, default=180)
    parser.add_argument("--jobs-timeout", type=float, default=300)
    parser.add_argument("--logs", default="", help="keep every process's log under this folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object (one fleet size)")
    parser.add_argument(
        "--count-commands",
        action="store_true",
        help="database commands per node (registration and steady window), by process",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops its stack
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("faststream").setLevel(logging.WARNING)
    if args.quick:
        args.sweep, args.seconds, args.jobs = "500,1000", min(args.seconds, 30), min(args.jobs, 100)
    if not args.sweep:
        result = one(args, args.nodes)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return
    print("| " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|" + "---:|" * len(COLUMNS), flush=True)
    for nodes in (int(n) for n in args.sweep.split(",")):
        try:
            result = one(args, nodes)
            print(row(result), flush=True)
            if args.logs:
                (Path(args.logs) / f"{nodes}.json").write_text(json.dumps(result, indent=2))
        except Exception as exc:  # one size failing does not hide the others
            print(f"| {nodes} | failed: {exc!r} |", flush=True)


if __name__ == "__main__":
    main()
