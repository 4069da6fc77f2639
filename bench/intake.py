"""The submitter's write path alone: N new jobs stored and announced one at a time under the caps lock (as before
group commit) and in groups (`services/submitter/intake.py`), against the embedded database and a NATS server.

Reports jobs/s through the write path and the database server's CPU per job, each mode twice, alternating. The
REST API, placement and billing are left out: `bench/submit.py` measures the whole submission.
Run: `python -m bench.intake --jobs 400 --concurrency 8`.
"""

import argparse
import asyncio
import json
import resource
import tempfile
import time
import uuid
from pathlib import Path

from shared.bus import connect, make_broker
from shared.clock import utcnow
from shared.events import JobSubmitted
from shared.jobs import JobCreate
from shared.store import make_client
from bench.submit import free_port
from services.stack.processes import Stack, StackSettings
from services.submitter.caps import QueueCaps
from services.submitter.intake import Arrival, Intake
from services.submitter.repository import Repository

BODY = JobCreate.model_validate(
    {
        "kind": "job",
        "metadata": {"name": "x"},
        "algorithm": {"command": "true"},
        "spec": {"resource": {"flavor_id": "custom", "node_count": 1, "gpu_count": 0}},
    }
)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def arrival(i: int) -> Arrival:
    job_id, now = str(uuid.uuid4()), utcnow()
    event = JobSubmitted(
        event_id=f"{job_id}:submitted",
        job_id=job_id,
        project_id="bench",
        user_name="bench",
        name=f"job-{i}",
        algorithm=BODY.algorithm,
        spec=BODY.spec,
        create_time=now,
    )
    return Arrival(
        {
            "_id": job_id,
            "project_id": "bench",
            "name": f"job-{i}",
            "user_name": "bench",
            "create_time": now,
            "status": {"phase": "Creating"},
            "status_version": 0,
        },
        event,
    )


async def measure(stack: Stack, *, grouped: bool, jobs: int, concurrency: int) -> dict:
    broker = make_broker(stack.nats_url, name="bench", creds=stack.admin_creds())
    await connect(broker)
    client = make_client(stack.mongo_url_of("submitter"))
    repo = Repository(db=client[f"intake_{uuid.uuid4().hex[:8]}"], broker=broker)
    await repo.create_indexes()
    caps = QueueCaps(per_project=10 * jobs, per_user=10 * jobs)
    intake, lock, waiting = Intake(repo, caps), asyncio.Lock(), [arrival(i) for i in range(jobs)]

    async def client_loop() -> None:
        while waiting:
            job = waiting.pop()
            if grouped:
                await intake.announce((job.doc["_id"], await intake.store(job)))
                continue
            async with lock:  # the path before group commit: counted and stored in one step, one job at a time
                await caps.check(repo, project_id="bench", user_name="bench")
                entries = await repo.insert(job.doc, job.event)
            await repo.publish(job.doc["_id"], entries)

    database = stack.processes["database-submitter"].pid
    db_before, own_before, start = cpu_s(database), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    elapsed, own = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    await broker.stop()
    await client.close()
    return {
        "mode": "grouped" if grouped else "one at a time",
        "jobs_per_s": round(jobs / elapsed, 1),
        "database_cpu_ms_per_job": round(1000 * (cpu_s(database) - db_before) / jobs, 2),
        "client_cpu_ms_per_job": round(
            1000 * (own.ru_utime + own.ru_stime - own_before.ru_utime - own_before.ru_stime) / jobs, 2
        ),
        "groups": intake.store.groups if grouped else jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tm-intake-") as tmp:
        stack = Stack(StackSettings(data_dir=Path(tmp), nats_port=free_port(), mongo_url=None, nats_url=None))
        try:
            stack.start_nats()
            stack.start_database("submitter")
            stack.prepare_bus()
            runs = [
                asyncio.run(measure(stack, grouped=grouped, jobs=args.jobs, concurrency=args.concurrency))
                for grouped in (False, True, False, True)
            ]
        finally:
            stack.stop_all()
    print(json.dumps({"jobs": args.jobs, "concurrency": args.concurrency, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
