"""Usage-report benchmark: a month of 10,000 jobs in a fresh embedded database, each group_by timed.

Ledger lines are inserted directly (one attempt per job, over 20 users in 5 projects and 40 nodes of three
kinds, with node lifetimes for owned capacity and 200 on-demand nodes), then Reports.usage answers the report
the API asks for, for one project and, with group_by=project, for all. Run: `python -m bench.reports`.
"""

import argparse
import asyncio
import json
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shared.rpc import UsageQuery
from shared.store import make_client
from services.billing.ledger import clip, close_entry, close_lifetime, open_lifetime
from services.billing.live import LiveLines
from services.billing.reports import Reports
from services.stack.processes import Stack, StackSettings

MONTH = datetime(2026, 10, 1, tzinfo=UTC)
KINDS = ("local", "reserved", "on_demand")
PRICES = {"local": 0.4, "reserved": 1.5, "on_demand": 3.6}


def attempts(jobs: int, rng: random.Random) -> list[dict]:
    lines = []
    for i in range(jobs):
        kind = KINDS[i % 3]
        start = MONTH + timedelta(seconds=rng.uniform(0, 30 * 86400))
        opened = {
            "_id": f"job-{i}:1:0",
            "job_id": f"job-{i}",
            "attempt": 1,
            "rank": 0,
            "project_id": f"proj-{i % 5}",
            "user_name": f"user-{i % 20}",
            "node_id": f"{kind}-{i % 40}" if kind != "on_demand" else f"od-{i % 200}",
            "node_kind": kind,
            "gpu_count": 1 + i % 4,
            "price_per_hour": PRICES[kind],
            "started_at": start,
        }
        lines.append(
            close_entry(opened, ended_at=start + timedelta(seconds=rng.uniform(60, 4 * 3600)), reason="completed")
        )
    return lines


def lifetimes() -> list[dict]:
    lines = []
    for n in range(40):
        kind = KINDS[n % 2]
        lines.append(
            close_lifetime(
                open_lifetime(
                    node_id=f"{kind}-{n}",
                    kind=kind,
                    price_per_hour=PRICES[kind],
                    gpu_count=4,
                    started_at=MONTH,
                    source="registered",
                ),
                ended_at=MONTH + timedelta(days=30),
                reason="node_lost",
            )
        )
    for n in range(200):
        start = MONTH + timedelta(days=n * 0.15)
        lines.append(
            close_lifetime(
                open_lifetime(
                    node_id=f"od-{n}",
                    kind="on_demand",
                    price_per_hour=3.6,
                    gpu_count=1,
                    started_at=start,
                    project_id=f"proj-{n % 5}",
                    user_name=f"user-{n % 20}",
                    source="provisioned",
                ),
                ended_at=start + timedelta(hours=6),
                reason="released: idle",
            )
        )
    return lines


async def run(url: str, *, jobs: int, repeats: int) -> dict:
    client = make_client(url)
    db = client["bench"]
    billing = Reports(
        ledger=db.billing_ledger, live=LiveLines(), nodes=db.billing_nodes, nodes_open=db.billing_nodes_open
    )
    await billing.ledger.create_index([("project_id", 1), ("started_at", 1)])
    await billing.ledger.create_index([("project_id", 1), ("t0", 1)])
    await billing.ledger.create_index("ended_at")
    rng = random.Random(7)
    lines = attempts(jobs, rng)
    t0 = time.perf_counter()
    for i in range(0, len(lines), 1000):
        await billing.ledger.insert_many(lines[i : i + 1000])
    await billing.nodes.insert_many(lifetimes())
    loaded_s = time.perf_counter() - t0
    window = {"start": MONTH + timedelta(days=3), "end": MONTH + timedelta(days=27)}
    cases = {
        f"{g} (project)": UsageQuery(project_id="proj-1", group_by=g, **window) for g in ("user", "node_kind", "node")
    }
    cases["project (all, admin)"] = UsageQuery(group_by="project", **window)
    cases["user (project, whole month)"] = UsageQuery(project_id="proj-1", group_by="user")
    # what admission and budget alerts ask, on every submission to a project with quotas and every budget check
    cases["admission: spend only (project, whole month)"] = cases["user (project, whole month)"]
    figures = {}
    for name, query in cases.items():
        times = []
        for _ in range(repeats):
            billing.ledger_reads.kept.clear()  # each report reads the ledger (the next case's reuse is timed apart)
            billing.lifetime_reads.kept.clear()
            started = time.perf_counter()
            report = await billing.usage(query, spend_only=name.startswith("admission"))
            times.append(time.perf_counter() - started)
        figures[name] = {
            "median_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3),
            "groups": len(report.groups),
            "attempts": report.total.attempts,
        }
    # admission's question again and again with no line closed between (submissions to a project with quotas
    # while its jobs run): the ledger's sums reused, the running lines read afresh
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        again = await billing.usage(cases["admission: spend only (project, whole month)"], spend_only=True)
        times.append(time.perf_counter() - started)
    figures["admission again, nothing closed since"] = {
        "median_s": round(statistics.median(times), 4),
        "max_s": round(max(times), 4),
        "groups": len(again.groups),
        "attempts": again.total.attempts,
    }
    expected = [
        c
        for line in lines
        if line["project_id"] == "proj-1" and (c := clip(line, start=window["start"], end=window["end"]))
    ]
    checked = figures["user (project)"]["attempts"] == len(expected)
    started = time.perf_counter()  # the same sums without $group: every line fetched and added up here
    fetched = [
        d
        async for d in billing.ledger.find(
            {"project_id": "proj-1", "ended_at": {"$gt": window["start"]}, "started_at": {"$lt": window["end"]}}
        )
    ]
    sum(c["cost"] for d in fetched if (c := clip(d, **window)))
    baseline_s = time.perf_counter() - started
    await client.close()
    return {
        "jobs": jobs,
        "load_s": round(loaded_s, 2),
        "reports": figures,
        "matches_python_sum": checked,
        "fetch_and_sum_in_python_s (project window, no $group)": round(baseline_s, 3),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(StackSettings(data_dir=Path(tmp)))
        (stack.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        stack.start_database("submitter")
        try:
            figures = asyncio.run(run(stack.mongo_url_of("submitter"), jobs=args.jobs, repeats=args.repeats))
            print(json.dumps(figures, indent=2))
            if not figures["matches_python_sum"]:  # it said false for a while and nobody read it (2026-11-28)
                raise SystemExit("the report's attempts differ from the lines summed here: a report is wrong")
        finally:
            stack.stop_all()


if __name__ == "__main__":
    main()
