"""Where each process of a stack spends its CPU over a window: py-spy (a measuring tool, not a dependency of the
project: `pip install py-spy`) samples every Python process, and each sample is put down to what it was doing
(the library its innermost recognised frame belongs to) and to what it was for (the project function, handler or
loop, that the work was done for). `bench.submit --profile DIR` uses it over a burst and reports the table."""

import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

# What a sample was doing: the first rule, from the innermost frame outwards, whose path fragment a frame holds.
KINDS = (
    ("logging", ("logging/",)),
    (
        "thread hand-offs (worker threads, their queues, waking the loop)",
        (
            "threading.py",
            "queue.py",
            "concurrent/",
            "anyio/",
            "_write_to_self",
            "to_thread",
        ),
    ),
    ("socket sends and receives", ("selector_events.py", "asyncio/streams.py", "network_layer.py")),
    ("pydantic validation and encoding", ("pydantic/", "pydantic_core", "fast_depends/")),
    ("json", ("json/", "orjson")),
    ("bson and database client", ("bson/", "pymongo/")),
    ("embedded database (SQL)", ("nx27017", "nx_27017", "neosqlite", "sqlite3")),
    ("nats client", ("nats/",)),
    ("faststream dispatch", ("faststream/",)),
    ("http (uvicorn, starlette, fastapi, httpx)", ("uvicorn/", "starlette/", "fastapi/", "h11/", "httpx/")),
    ("asyncio loop", ("asyncio/", "selectors.py", "contextlib.py")),
    ("project code", ("services/", "shared/")),
)
# A sample whose innermost frame waits (for the loop's next event, a worker thread's next job): the thread was woken
# and runnable but not yet running. On a loaded machine py-spy counts it active; it is kept apart from the CPU shares.
WAITS = ("EpollSelector.select", "Condition.wait", "Event.wait", "Queue.get")
# Wrappers every handler runs inside: what the work was for is the project frame within them.
WRAPPERS = (
    "shared/keyed.py",
    "shared/bus.py",
    "shared/replies.py",
    "shared/app.py",
    "shared/lease.py",
    "shared/service.py",
)


def frames(stack: str) -> list[str]:
    """A raw py-spy stack, outermost first: 'func (path:line)' each."""
    return [f for f in stack.split(";") if f]


def kind_of(stack: list[str]) -> str:
    """What the innermost recognised frame of a sample belongs to ('other' when none; 'waiting' for a wait)."""
    if stack and stack[-1].startswith(WAITS):
        return "waiting"
    for frame in reversed(stack):
        for kind, fragments in KINDS:
            if any(fragment in frame for fragment in fragments):
                return kind
    return "other"


def purpose_of(stack: list[str]) -> str:
    """The outermost project function a sample ran for (past the wrappers every handler runs in), as
    'module.py:function'; where none is on the stack, the library task or thread it ran in ('library: <function>',
    the first frame the event loop or a thread ran)."""
    for frame in stack:
        name, _, where = frame.rpartition(" (")
        path = where.split(":")[0]
        if ("services/" in path or "shared/" in path) and not path.endswith(WRAPPERS):
            if name.endswith("<module>") or name.endswith("main"):
                continue
            return f"{'/'.join(path.split('/')[-2:])}:{name.split('.')[-1]}"
    names = [frame.rpartition(" (")[0] for frame in stack]
    for entry in ("Handle._run", "Thread._bootstrap_inner"):
        if entry in names and names.index(entry) + 1 < len(names):
            return f"library: {names[names.index(entry) + 1]}"
    return f"library: {names[-1] if names else '?'}"


def read_samples(path: Path) -> Counter[tuple[str, ...]]:
    """A py-spy raw file as stacks and their sample counts."""
    samples: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit() and stack.strip():
            samples[tuple(frames(stack))] += int(count)
    return samples


def summarize(samples: Counter[tuple[str, ...]], *, cpu_s: float, jobs: int, top: int = 12) -> dict:
    """A process's CPU per job split by kind and by purpose (its measured CPU seconds shared out in proportion to
    the samples that were not waits), in milliseconds a job; the `top` purposes only, and the share of samples that
    were waits."""
    kinds: Counter[str] = Counter()
    purposes: Counter[str] = Counter()
    for stack, count in samples.items():
        kind = kind_of(list(stack))
        kinds[kind] += count
        if kind != "waiting":
            purposes[purpose_of(list(stack))] += count
    waits = kinds.pop("waiting", 0)
    total = sum(kinds.values()) or 1

    def ms(counts: Counter[str], limit: int) -> dict[str, float]:
        return {k: round(1000 * cpu_s * v / total / jobs, 2) for k, v in counts.most_common(limit)}

    return {
        "cpu_ms_per_job": round(1000 * cpu_s / jobs, 1),
        "samples": total,
        "waits": round(waits / (total + waits), 2),
        "by_kind": ms(kinds, len(KINDS) + 1),
        "by_purpose": ms(purposes, top),
    }


def start(pids: dict[str, int], folder: Path, *, rate: int = 67) -> dict[str, subprocess.Popen]:
    """A py-spy sampler on each process (without pausing it), writing raw stacks into `folder/<name>.txt`."""
    spy = shutil.which("py-spy") or str(Path(__file__).resolve().parents[1] / ".venv/bin/py-spy")
    folder.mkdir(parents=True, exist_ok=True)
    for name in pids:  # a previous run's samples are never read as this run's
        (folder / f"{name}.txt").unlink(missing_ok=True)
    return {
        name: subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--nonblocking",
                "--format",
                "raw",
                "-o",
                str(folder / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    }


def stop(samplers: dict[str, subprocess.Popen]) -> None:
    """Stop every sampler; each writes its file as it stops."""
    for sampler in samplers.values():
        sampler.send_signal(signal.SIGINT)
    for sampler in samplers.values():
        try:
            sampler.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sampler.kill()
            sampler.wait()


def subject_kind(subject: str) -> str:
    """A subject with its node and job tokens blanked: 'tm.job.task.*.started', 'tm.log.*.*'."""
    parts = subject.split(".")
    if parts[:3] == ["tm", "job", "task"] or parts[:3] == ["tm", "node", "cmd"]:
        parts[3] = "*"
    elif parts[:2] in (["tm", "log"], ["tm", "telemetry"]):
        parts[2:] = ["*"] * len(parts[2:])
    elif parts[:2] in (["tm", "eta"], ["tm", "notify"]):
        parts[2:] = ["*"]
    elif parts[:3] == ["tm", "node", "evt"] and len(parts) == 5:
        parts[3] = "*"
    return ".".join(parts)


async def bus_counts(nats_url: str, creds: Path) -> dict[str, Counter[str]]:
    """Messages each stream holds by subject kind, and messages each durable consumer was delivered so far."""
    import nats

    from shared import busroles
    from shared.bus import STREAMS, servers

    nc = await nats.connect(
        servers(nats_url), user_credentials=str(creds), inbox_prefix=busroles.inbox(busroles.OPERATOR)
    )
    try:
        js = nc.jetstream()
        subjects: Counter[str] = Counter()
        consumers: Counter[str] = Counter()
        for stream in STREAMS:
            info = await js.stream_info(stream.name, subjects_filter=">")
            for subject, count in (info.state.subjects or {}).items():
                subjects[subject_kind(subject)] += count
            for consumer in await js.consumers_info(stream.name):
                consumers[consumer.name] += consumer.delivered.consumer_seq or 0
        return {"published": subjects, "delivered": consumers}
    finally:
        await nc.close()


def per_job(before: dict[str, Counter[str]], after: dict[str, Counter[str]], *, jobs: int) -> dict:
    """Bus messages a job cost between two `bus_counts`: published by subject kind, delivered by consumer."""
    return {
        part: {k: round(v / jobs, 2) for k, v in (after[part] - before[part]).most_common()}
        for part in ("published", "delivered")
    }
