"""Rate limits per user, caps on queued jobs, and the blame of a job nothing could ever hold (pure parts)."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from shared.events import JobStatusChanged
from shared.jobs import Phase, SecondaryPhase, Spec
from shared.rpc import Candidate, CandidatesReply
from services.submitter import feasible
from services.submitter.caps import QueueCaps, queue_full
from services.submitter.errors import ApiError, described
from services.submitter.limits import RateLimiter, TokenBucket
from services.submitter.refusals import Invalid, QueueFull
from services.submitter.repository import Repository
from tests.memory import MemoryCollection


def test_a_bucket_gives_its_burst_then_its_rate():
    bucket = TokenBucket(rate=20, burst=100, tokens=100, updated=0.0)
    assert [bucket.take(0.0) for _ in range(100)] == [0.0] * 100
    assert bucket.take(0.0) == pytest.approx(0.05)
    assert bucket.take(0.05) == 0.0 and bucket.take(0.05) > 0
    assert bucket.take(10.0) == 0.0 and bucket.tokens == pytest.approx(99)  # refills up to the burst, not beyond


def test_the_limiter_answers_429_with_retry_after_per_key():
    limiter = RateLimiter(rate=1, burst=2)
    limiter.charge("a", 0.0)
    limiter.charge("a", 0.0)
    with pytest.raises(ApiError) as refused:
        limiter.charge("a", 0.0)
    assert refused.value.status == 429 and refused.value.code == "406042"
    assert refused.value.headers == {"Retry-After": "1"}
    limiter.charge("b", 0.0)  # another user has his own bucket


def test_the_limiter_forgets_idle_buckets_when_too_many_keys():
    limiter = RateLimiter(rate=1, burst=1, max_keys=3)
    for key in "abc":
        limiter.take(key, 0.0)
    limiter.take("d", 100.0)  # a, b and c are full again: forgotten
    assert set(limiter.buckets) == {"d"}
    busy = RateLimiter(rate=1, burst=1, max_keys=2)
    busy.take("a", 0.0), busy.take("b", 0.0), busy.take("c", 0.0)  # none full: half go anyway
    assert len(busy.buckets) <= 2


def test_queue_full_names_the_scope_and_the_cap():
    assert queue_full(scope="project", name="p", queued=999, cap=1000) is None
    refusal = queue_full(scope="user", name="ana", queued=500, cap=500)
    status, code, message, headers = described(refusal)
    assert (status, code, headers) == (429, "406035", {"Retry-After": "10"}) and "user ana" in message
    assert "500 of 500" in refusal.message


def api_repository() -> Repository:
    return Repository(
        db=SimpleNamespace(
            api_jobs=MemoryCollection("jobs"),
            api_queue=MemoryCollection("queue"),
            api_job_list=MemoryCollection("list"),
            api_logs=MemoryCollection("logs"),
            api_log_sizes=MemoryCollection("sizes"),
            api_notifications=MemoryCollection("notifications"),
            api_projects=MemoryCollection("projects"),
        ),
        broker=None,
        list_later_s=0,  # every list entry at once: these follow the versions' races, not the waiting
    )


CREATED = datetime(2026, 11, 25, tzinfo=UTC)


async def test_queue_caps_count_only_jobs_not_yet_running():
    repo = api_repository()
    for i, phase in enumerate(["Creating", "Pending", "Running", "Completed", "Pending"]):
        await repo.jobs.insert_one(
            {
                "_id": str(i),
                "project_id": "p" if i < 4 else "q",
                "user_name": "ana",
                "status": {"phase": phase},
                "status_version": 1,
                "create_time": CREATED,
            }
        )
    assert await repo.rebuild_views() == 3
    await QueueCaps(per_project=3, per_user=4).check(repo, project_id="p", user_name="ana")
    with pytest.raises(QueueFull) as refused:
        await QueueCaps(per_project=2, per_user=10).check(repo, project_id="p", user_name="ana")
    assert "project p" in refused.value.message
    with pytest.raises(QueueFull) as refused:
        await QueueCaps(per_project=10, per_user=3).check(repo, project_id="p", user_name="ana")
    assert "user ana" in refused.value.message


class CountedQueue:
    """A queue of `queued` jobs per project and user that counts how often it is counted, and the places in it this
    process gave (`added`)."""

    def __init__(self, queued: int) -> None:
        self.queued, self.counts, self.added = queued, 0, 0

    async def queued_count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        self.counts += 1
        return self.queued

    def queued_added(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        return self.added

    def give(self) -> None:
        """The intake stores one job."""
        self.queued += 1
        self.added += 1


async def test_the_caps_trust_a_fresh_count_plus_the_places_given_since_and_count_again_to_refuse_or_when_old():
    now = [100.0]
    caps, queue = QueueCaps(per_project=3, per_user=10, clock=lambda: now[0]), CountedQueue(queued=1)
    assert await caps.admit_group(queue, [("p", "ana")]) == [None]
    assert queue.counts == 2  # the project and the user
    queue.give()  # 2 queued
    await caps.check(queue, project_id="p", user_name="ana")
    assert await caps.admit_group(queue, [("p", "ana")]) == [None]
    queue.give()  # 3 of 3
    assert queue.counts == 2  # 1 counted + the places given since: room, twice
    queue.queued = 1  # two left the queue (their statuses handled by another API replica, say)
    await caps.check(queue, project_id="p", user_name="ana")  # 3 remembered would refuse: the project counted again
    assert queue.counts == 3
    now[0] += 2.0
    await caps.check(queue, project_id="p", user_name="ana")
    assert queue.counts == 5  # too old: both counted
    queue.queued = 3  # another replica stored two: not seen before the count is old (what replicas may overshoot)
    await caps.check(queue, project_id="p", user_name="ana")
    now[0] += 2.0
    with pytest.raises(QueueFull):
        await caps.check(queue, project_id="p", user_name="ana")
    assert queue.counts == 7


def status(job_id: str, *, version: int, phase: Phase) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:{version}",
        job_id=job_id,
        project_id="p",
        user_name="ana",
        version=version,
        phase=phase,
        secondary_phase=SecondaryPhase.RUNNING,
    )


async def test_the_queue_follows_each_jobs_latest_status_whatever_order_they_come_in():
    repo = api_repository()
    await repo.jobs.insert_one(
        {
            "_id": "j",
            "name": "j",
            "project_id": "p",
            "user_name": "ana",
            "status": {"phase": "Creating"},
            "status_version": 0,
            "create_time": CREATED,
        }
    )
    await repo.sync_views("j")
    assert await repo.queued_count(project_id="p") == 1
    await repo.apply_status(status("j", version=3, phase=Phase.RUNNING))
    await repo.apply_status(status("j", version=2, phase=Phase.PENDING))  # late: changes nothing
    assert await repo.queued_count(project_id="p") == 0 and await repo.queued_count(user_name="ana") == 0
    await repo.apply_status(status("j", version=4, phase=Phase.PENDING))  # requeued
    assert await repo.queued_count(user_name="ana") == 1


async def test_a_stale_queue_write_loses_to_the_newer_status_written_before_it():
    repo = api_repository()
    await repo.jobs.insert_one(
        {
            "_id": "j",
            "name": "j",
            "project_id": "p",
            "user_name": "ana",
            "status": {"phase": "Pending"},
            "status_version": 2,
            "create_time": CREATED,
        }
    )
    await repo.sync_views("j")
    read = repo.jobs.find_one

    async def read_then_change(query, projection=None):  # another handler applies version 3 right after this read
        doc = await read(query, projection)
        if doc and doc["status_version"] == 2:
            await repo.apply_status(status("j", version=3, phase=Phase.RUNNING))
        return doc

    repo.jobs.find_one = read_then_change
    await repo.sync_views("j")
    assert await repo.queued_count(project_id="p") == 0
    assert (await repo.page("p", phases=["Running"], offset=0, limit=10))[0] == 1


async def test_a_page_of_jobs_is_sorted_and_counted_on_the_list_entries_and_follows_each_jobs_status():
    repo = api_repository()
    for i in range(5):
        await repo.jobs.insert_one(
            {
                "_id": f"j{i}",
                "project_id": "p" if i != 2 else "q",
                "user_name": "ana",
                "status": {"phase": "Pending"},
                "status_version": 1,
                "create_time": CREATED + timedelta(seconds=i),
            }
        )
    await repo.rebuild_views()
    total, docs = await repo.page("p", phases=[], offset=1, limit=2)
    assert total == 4 and [d["_id"] for d in docs] == ["j3", "j1"]  # newest first, another project's left out
    await repo.jobs.update_one({"_id": "j4"}, {"$set": {"status": {"phase": "Running"}, "status_version": 2}})
    await repo.apply_status(status("j4", version=2, phase=Phase.RUNNING))
    total, docs = await repo.page("p", phases=["Running"], offset=0, limit=10)
    assert total == 1 and docs[0]["_id"] == "j4"
    await repo.jobs.update_one({"_id": "j4"}, {"$set": {"status": {"phase": "Completed"}}})
    assert await repo.delete("j4", finished=["Completed"])
    assert (await repo.page("p", phases=[], offset=0, limit=10))[0] == 3


# A fleet of one 16-CPU node with 2 GPUs of 24 GB, and an on-demand catalogue of 8-CPU 80 GB GPU nodes.
def fleet_answer(spec: Spec) -> CandidatesReply:
    r = spec.resource
    local = r.cpu_count <= 16 and r.gpu_count <= 2 and r.min_gpu_memory_gb <= 24 and r.node_count <= 1
    rented = r.cpu_count <= 8 and r.gpu_count <= 1 and r.min_gpu_memory_gb <= 80
    kinds = {"local": local, "on_demand": rented, "reserved": False}
    if spec.placement.allowed == "local":
        kinds = {"local": local}
    offers = [
        Candidate(
            node_kind=k,
            price_per_hour=1,
            predicted_duration_s=1,
            duration_source="default",
            expected_cost=1,
            free_now=True,
        )
        for k, ok in kinds.items()
        if ok
    ]
    return CandidatesReply(candidates=offers, unplaceable_kinds={k: "no node" for k, ok in kinds.items() if not ok})


async def ask(spec: Spec) -> CandidatesReply:
    return fleet_answer(spec)


@pytest.mark.parametrize(
    ("resource", "allowed", "fields"),
    [
        ({"node_count": 64, "cpu_count": 1000}, "any", ["spec.resource.cpu_count"]),
        ({"gpu_count": 2, "min_gpu_memory_gb": 1024}, "any", ["spec.resource.min_gpu_memory_gb"]),
        ({"gpu_count": 16}, "any", ["spec.resource.gpu_count"]),
        ({"node_count": 2}, "local", ["spec.resource.node_count"]),
        ({"node_count": 2, "cpu_count": 12}, "any", ["spec.resource.node_count"]),  # either: the first that helps
        ({"gpu_count": 1, "min_gpu_memory_gb": 40}, "local", ["spec.resource.min_gpu_memory_gb"]),
        (
            {"gpu_count": 1, "min_gpu_memory_gb": 60, "cpu_count": 20},
            "local",
            ["spec.resource.min_gpu_memory_gb", "spec.resource.cpu_count"],
        ),
    ],
)
async def test_a_job_nothing_could_hold_is_refused_naming_the_field(resource, allowed, fields):
    spec = Spec.model_validate({"resource": resource, "placement": {"allowed": allowed}})
    with pytest.raises(Invalid) as refused:
        await feasible.check(spec, fleet_answer(spec), ask)
    status, code, message, _ = described(refused.value)
    assert (status, code, refused.value.field) == (400, "406001", fields[0])
    assert message.startswith(f"param[{fields[0]}] invalid: no node of the fleet")
    assert await feasible.blame(spec, lambda s: _placeable(s)) == fields


async def _placeable(spec: Spec) -> bool:
    return not feasible.never_placeable(spec, fleet_answer(spec))


async def test_a_job_some_node_could_hold_passes():
    for resource in ({"node_count": 64, "cpu_count": 1}, {"gpu_count": 2, "min_gpu_memory_gb": 24}):
        spec = Spec.model_validate({"resource": resource})
        await feasible.check(spec, fleet_answer(spec), ask)


async def test_blame_names_every_field_that_cannot_be_kept():
    spec = Spec.model_validate({"resource": {"gpu_count": 16, "cpu_count": 1000}})
    assert await feasible.blame(spec, _placeable) == ["spec.resource.gpu_count", "spec.resource.cpu_count"]
    with pytest.raises(Invalid) as refused:
        await feasible.check(spec, fleet_answer(spec), ask)
    assert "(together with param[spec.resource.cpu_count])" in refused.value.message


async def test_a_restart_rewrites_only_the_list_entries_that_differ_from_the_jobs():
    repo = api_repository()
    for i in range(3):
        await repo.jobs.insert_one(
            {
                "_id": f"j{i}",
                "project_id": "p",
                "user_name": "ana",
                "status": {"phase": "Completed"},
                "status_version": 4,
                "create_time": CREATED + timedelta(seconds=i),
            }
        )
    await repo.rebuild_views()
    await repo.listing.update_one({"_id": "j1"}, {"$set": {"phase": "Running"}})  # a crash between the two writes
    await repo.listing.insert_one({"_id": "gone", "project_id": "p", "created_s": 0.0, "phase": "Completed"})
    writes = []
    replace = repo.listing.replace_one

    async def counted(query, doc, upsert=False):
        writes.append(query["_id"])
        return await replace(query, doc, upsert=upsert)

    repo.listing.replace_one = counted
    await repo.rebuild_views()
    assert writes == ["j1"]
    total, docs = await repo.page("p", phases=["Completed"], offset=0, limit=10)
    assert total == 3 and [d["_id"] for d in docs] == ["j2", "j1", "j0"]
