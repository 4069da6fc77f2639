"""Where the first jobs after a stack's start spend their submit → Running: every bus message of each job (and the
RPCs between) as the NATS server passed it on, in milliseconds from its submission, job by job. Also how long the
stack took to start (`start_all`: until the API answers, every process up) and until every service answered its
health probe. Run: `python -m bench.firstjob --jobs 3` (a fresh stack each `--rounds`).
"""

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import nats

from shared import busroles
from shared.bus import RPC_HEALTH, servers
from bench import cpuprofile
from bench.submit import NOOP, TOKEN, bench_settings, cluster
from services.stack.processes import SERVICES, Stack

NOISE = re.compile(  # acknowledgements, pull requests, heartbeats: every job has them, they say nothing of its hops
    r"^(\$JS\.ACK|\$JS\.API\.CONSUMER\.MSG\.NEXT|\$JS\.API\.STREAM\.INFO|tm\.node\.evt\.[^.]+\.heartbeat)"
)


HOPS = (  # the steps of a job's start, in order: each one's first message after the submission
    "tm.rpc.placement.candidates",
    "tm.rpc.billing.admit",
    "tm.job.submitted",
    "tm.job.placed",
    "tm.node.cmd.*.start",
    "tm.job.task.*.started",
    "tm.job.status (Running)",
)


def steps(lines: list[tuple[float, str]]) -> dict[str, float]:
    """When each of `HOPS` was first seen (ms from the submission)."""
    firsts: dict[str, float] = {}
    for at, what in lines:
        kind = re.sub(r"^(tm\.node\.cmd|tm\.job\.task)\.[^.]+\.", r"\1.*.", what)
        if kind in HOPS and kind not in firsts:
            firsts[kind] = at
    return firsts


def hop(subject: str, data: bytes) -> str:
    """What a message was, short: its subject with the node's and job's ids left out, and its phase if a status."""
    kind = re.sub(r"_INBOX_([a-z]+)[^ ]*", r"reply→\1", subject)
    kind = re.sub(r"^(tm\.log|tm\.telemetry)\.[^.]+\..*", r"\1", kind)
    status = re.match(r"^tm\.job\.status\.([A-Za-z]+)\.[A-Za-z]+$", subject)  # its phase is in the subject
    if status:
        kind = "tm.job.status"
    phase = status.group(1).encode() if status else None
    ack = re.match(rb'\{"stream":\s*"([A-Z_]+)",\s*"seq":\s*(\d+)', data) if kind.startswith("reply") else None
    if ack:  # a stream's answer to a publish: the message is stored (and, with `sync_interval: always`, on disk)
        return f"{kind} (stored in {ack.group(1).decode()} as {ack.group(2).decode()})"
    return kind + (f" ({phase.decode()})" if phase else "")


async def services_answer(nc: nats.NATS, *, timeout_s: float = 60) -> float:
    """Seconds until every service answered its health probe."""
    started = time.monotonic()
    pending = set(SERVICES)
    while pending and time.monotonic() - started < timeout_s:
        for name in sorted(pending):
            try:
                await nc.request(RPC_HEALTH.format(service=name), b"", timeout=0.5)
                pending.discard(name)
            except Exception:  # not yet (no responders, a timeout)
                await asyncio.sleep(0.05)
    return time.monotonic() - started


async def timelines(stack: Stack, *, jobs: int, spy: list[str], folder: Path) -> list[list[tuple[float, str]]]:
    """Each job's messages, one job at a time (the next submitted once the one before finished); the processes
    named in `spy` sampled by py-spy over the first job and the second, into `folder`/<name>-<job>.txt."""
    seen: list[tuple[float, str, bytes]] = []
    nc = await nats.connect(
        servers(stack.nats_url),
        user_credentials=str(stack.admin_creds()),
        inbox_prefix=busroles.inbox(busroles.OPERATOR),
    )

    async def keep(msg: nats.aio.msg.Msg) -> None:
        if not NOISE.match(msg.subject):
            seen.append((time.monotonic(), msg.subject, msg.data))

    await nc.subscribe(">", cb=keep)
    await nc.subscribe("$JS.API.>", cb=keep)
    out = []
    try:
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as api:
            for i in range(jobs):
                samplers = {}
                if i < 2 and spy:
                    pids = {f"{name}-{i}": stack.processes[name].pid for name in spy}
                    samplers = cpuprofile.start(pids, folder, rate=1000)
                    await asyncio.sleep(1.5)  # py-spy attached
                seen.clear()
                sent = time.monotonic()
                answer = await api.post("/v2/bench/training-jobs", json={"metadata": {"name": f"first-{i}"}, **NOOP})
                job_id = answer.raise_for_status().json()["metadata"]["id"]
                for _ in range(3000):
                    job = (await api.get(f"/v2/bench/training-jobs/{job_id}")).json()
                    if job["status"]["phase"] in ("Completed", "Failed", "Terminated"):
                        break
                    await asyncio.sleep(0.02)
                cpuprofile.stop(samplers)
                running = (job["status"]["start_time"] - job["metadata"]["create_time"]) / 1000
                lines = [(round((t - sent) * 1000, 1), hop(s, d)) for t, s, d in list(seen)]
                out.append([(running * 1000, "submit → Running (the platform's times)"), *lines])
    finally:
        await nc.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--until-ms", type=float, default=1000, help="leave out messages later than this")
    parser.add_argument("--spy", nargs="*", default=[], help="processes to sample with py-spy over jobs 0 and 1")
    parser.add_argument("--spy-dir", type=Path, default=Path("firstjob-samples"))
    args = parser.parse_args()
    table: list[tuple[int, float, dict[str, float]]] = []  # (job, submit → Running, each hop) of every round
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="tm-first-") as tmp:
            data = Path(tmp)
            (data / "cluster.toml").write_text(cluster(3))
            stack = Stack(bench_settings(data))
            try:
                started = time.monotonic()
                stack.start_all()
                up_s = time.monotonic() - started
                result = asyncio.run(first_jobs(stack, jobs=args.jobs, spy=args.spy, folder=args.spy_dir))
            finally:
                stack.stop_all()
        print(json.dumps({"start_all_s": round(up_s, 2), **result["start"]}))
        print("job  POST→" + " →".join(h.split(".")[-1] if "(" not in h else "Running" for h in HOPS) + "  (ms)")
        for i, lines in enumerate(result["jobs"]):
            firsts = steps(lines[1:])
            table.append((i, lines[0][0], firsts))
            print(f"{i:3d} {lines[0][0]:6.0f}  " + " ".join(f"{firsts.get(h, float('nan')):7.1f}" for h in HOPS))
        for i, lines in enumerate(result["jobs"] if args.until_ms > 0 else []):
            print(f"job {i}: submit → Running {lines[0][0]:.0f} ms")
            for at, what in lines[1:]:
                if at <= args.until_ms:
                    print(f"  {at:8.1f} {what}")
        for name in args.spy:
            for i in range(min(2, args.jobs)):
                print(f"{name}, job {i}: samples at 1 kHz, each frame's running samples (waits left out)")
                for frame, count in inclusive(cpuprofile.read_samples(args.spy_dir / f"{name}-{i}.txt")):
                    print(f"  {count:5d} {frame}")
    summary = {"rounds": args.rounds, "first_job": medians(table, first=True), "later_jobs": medians(table)}
    print(json.dumps(summary, ensure_ascii=False))


def medians(table: list[tuple[int, float, dict[str, float]]], *, first: bool = False) -> dict[str, float]:
    """The median of each step (ms from the hop before it) and of submit → Running, over the first jobs of every
    round (`first`) or over the others."""
    rows = [(running, firsts) for job, running, firsts in table if (job == 0) == first]
    out = {"submit_to_running_ms": statistics.median(r for r, _ in rows)} if rows else {}
    for before, hop_ in zip(("POST", *HOPS), HOPS, strict=False):
        spans = [f[hop_] - (f.get(before, 0.0) if before != "POST" else 0.0) for _, f in rows if hop_ in f]
        if spans and (before == "POST" or all(before in f for _, f in rows if hop_ in f)):
            out[f"{before.split('.')[-1]}→{hop_.split('.')[-1]}"] = round(statistics.median(spans), 1)
    return out


def inclusive(samples: Counter[tuple[str, ...]], *, top: int = 25) -> list[tuple[str, int]]:
    """The frames most running samples passed through (each counted once a sample), outermost loops left out."""
    counts: Counter[str] = Counter()
    for stack, n in samples.items():
        if stack and not stack[-1].startswith(cpuprofile.WAITS):
            for frame in set(stack):
                counts[frame] += n
    return [(f, c) for f, c in counts.most_common(top * 3) if "asyncio/" not in f and "<module>" not in f][:top]


async def first_jobs(stack: Stack, *, jobs: int, spy: list[str], folder: Path) -> dict:
    nc = await nats.connect(
        servers(stack.nats_url),
        user_credentials=str(stack.admin_creds()),
        inbox_prefix=busroles.inbox(busroles.OPERATOR),
    )
    try:
        answered = await services_answer(nc)
    finally:
        await nc.close()
    await asyncio.sleep(3)  # as bench.submit: every agent registered
    lines = await timelines(stack, jobs=jobs, spy=spy, folder=folder)
    return {"start": {"services_answer_after_s": round(answered, 2)}, "jobs": lines}


if __name__ == "__main__":
    main()
