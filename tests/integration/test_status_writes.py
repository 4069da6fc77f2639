"""What a job's status costs where it is kept, on the database server itself: the API's views (queue entries, list
entries, output counters) and billing's record of how attempts ended; in commands, and that each ends at the
latest status whatever order the statuses come in. Also what a job's other records cost: its attempts' billing
lines and its submission's audit records."""

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import AutoReconnect

from shared.events import Eta, EtaEstimated, JobStatusChanged, LogChunk, LogLine, NodeRegistered
from shared.grouped import insert_grouped, replace_if
from shared.jobs import Phase, SecondaryPhase
from shared.rpc import UsageQuery
from shared.store import DocumentStore
from services.billing import attempts as attempts_module
from services.billing.attempts import move_open_lines
from services.billing.ledger import STAMP, close_entry, open_entry
from services.billing.placements import Placements
from services.billing.service import Billing, build
from services.placement.queue import JobQueue, QueueItem, purge_loop
from services.stack.processes import Stack, StackSettings
from services.submitter import later as later_module
from services.submitter.audit import AuditLog
from services.submitter.caps import QueueCaps
from services.submitter.intake import Arrival, Intake
from services.submitter.refusals import QueueFull
from services.submitter.repository import Repository
from tests.conftest import eventually, free_port
from tests.factories import T0, exited, node, placed, started, submitted, unique

pytestmark = pytest.mark.integration
ITEM = {
    "project_id": "p",
    "user_name": "alice",
    "algorithm": {"command": "true"},
    "spec": {"resource": {"cpu_count": 1}},
    "submitted_at": T0,
}


class Commands(monitoring.CommandListener):
    """Every command the client sends, by name (the database's own cost is per command)."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()

    def started(self, event) -> None:
        self.sent[event.command_name] += 1

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass

    def total(self) -> int:
        return sum(self.sent.values())


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    stack = Stack(
        StackSettings(data_dir=tmp_path_factory.mktemp("db"), nats_port=free_port(), mongo_url=None, nats_url=None)
    )
    stack.start_database("submitter")
    yield stack.mongo_url_of("submitter")
    stack.stop_all()


@pytest.fixture
async def counted(database):
    commands = Commands()
    client = AsyncMongoClient(database, tz_aware=True, event_listeners=[commands])
    db = client[unique("views").replace("-", "_")]
    repo = Repository(db=db, broker=None)
    yield repo, commands
    repo.later_entries.waiting.clear()  # what a test left waiting is not written after the client closed
    repo.later_leaves.waiting.clear()
    await client.close()


def status(
    job_id: str, version: int, phase: Phase, secondary: SecondaryPhase, *, previous: Phase | None = None
) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:{version}",
        job_id=job_id,
        project_id="p",
        user_name="ana",
        version=version,
        phase=phase,
        secondary_phase=secondary,
        previous_phase=previous,
    )


LIFE = [
    (Phase.PENDING, SecondaryPhase.QUEUING),
    (Phase.CREATING, SecondaryPhase.CREATING),
    (Phase.RUNNING, SecondaryPhase.RUNNING),
    (Phase.RUNNING, SecondaryPhase.RUNNING),
    (Phase.COMPLETED, SecondaryPhase.COMPLETED),
]


async def new_job(repo: Repository, job_id: str, phase: str = "Pending", secondary: str = "Queuing") -> None:
    """A job stored with its queue and list entries, in `phase` (Pending by default)."""
    doc = {
        "_id": job_id,
        "name": job_id,
        "project_id": "p",
        "user_name": "ana",
        "status_version": 0,
        "status": {"phase": phase, "secondary_phase": secondary},
        "create_time": datetime(2026, 11, 25, tzinfo=UTC),
    }
    await repo.jobs.insert_one(doc)
    await repo.sync_views(job_id)


async def views(repo: Repository, job_id: str) -> tuple[bool, str]:
    """Whether the job holds a place in the queue (a tombstone holds none), and its list entry's phase."""
    entry = await repo.queue.find_one({"_id": job_id}) or {}
    return "project_id" in entry, (await repo.listing.find_one({"_id": job_id}))["phase"]


async def test_a_status_that_keeps_the_phase_costs_one_command_and_a_whole_life_seven(counted):
    repo, commands = counted
    await new_job(repo, "j")
    commands.sent.clear()
    await repo.apply_status(status("j", 1, *LIFE[0]))  # Pending as stored: one write, no view moves
    assert commands.total() == 1
    for version, (phase, secondary) in enumerate(LIFE[1:], start=2):
        await repo.apply_status(status("j", version, phase, secondary))
    # Each is one write, then: Creating, a list entry that waits; Running, a queue tombstone that waits (the list
    # entry waits too, replacing Creating's); Running again, nothing; Completed, its list entry at once, which
    # drops the waiting one (versioned entries need no re-read; it was 5 commands a status: a write, two reads,
    # two entries, then 1 + 3 + 4 + 1 + 3 with one re-read a phase, then 1 + 2 + 3 + 1 + 2 with every entry at
    # once).
    assert commands.total() == 1 + 1 + 1 + 1 + 2, dict(commands.sent)
    await repo.write_waiting()
    assert commands.total() == 7  # the tombstone (with any other job's that waited)
    assert await views(repo, "j") == (False, "Completed")


async def test_the_views_of_jobs_whose_statuses_come_together_are_written_together(counted):
    repo, commands = counted
    jobs = [f"burst-{n}" for n in range(20)]
    for job_id in jobs:
        await new_job(repo, job_id)
    commands.sent.clear()
    await asyncio.gather(*(repo.apply_status(status(job_id, 2, *LIFE[1])) for job_id in jobs))  # Creating
    assert commands.sent["findAndModify"] == 20  # each job's own conditional write
    assert commands.sent["update"] == 0, dict(commands.sent)  # 20 list entries of a passing phase wait
    await repo.write_waiting()
    assert commands.sent["update"] == 1, dict(commands.sent)  # then go out in one write
    assert {(await views(repo, job_id))[1] for job_id in jobs} == {"Creating"}


async def test_the_views_end_at_the_latest_status_whatever_order_and_concurrency(counted):
    repo, _ = counted
    orders = [[5, 4, 3, 2, 1], [2, 1, 5, 3, 4], [1, 2, 3, 4, 5]]
    for n, order in enumerate(orders):
        job_id = f"j{n}"
        await new_job(repo, job_id)
        events = {v: status(job_id, v, *LIFE[v - 1]) for v in range(1, 6)}
        await asyncio.gather(*(repo.apply_status(events[v]) for v in order))
        await asyncio.gather(*(repo.apply_status(events[v]) for v in order))  # every one redelivered
        assert await views(repo, job_id) == (False, "Completed"), order
    await new_job(repo, "requeued")
    await repo.apply_status(status("requeued", 3, Phase.RUNNING, SecondaryPhase.RUNNING))
    await repo.apply_status(status("requeued", 4, Phase.PENDING, SecondaryPhase.QUEUING))
    await repo.write_waiting()
    assert await views(repo, "requeued") == (True, "Pending")
    assert await repo.queued_count(project_id="p") == 1


async def test_an_older_status_whose_views_land_last_does_not_overwrite_the_newer(counted):
    """The race the re-read used to catch: the older status passed the job's write first, the newer one wrote its
    views first; the older one's views, written last, are refused."""
    repo, _ = counted
    await new_job(repo, "race")
    await repo.apply_status(status("race", 3, Phase.RUNNING, SecondaryPhase.RUNNING))
    stale = {
        "_id": "race",
        "project_id": "p",
        "user_name": "ana",
        "status_version": 2,
        "status": {"phase": "Pending"},
        "create_time": datetime(2026, 11, 25, tzinfo=UTC),
    }
    await repo.write_waiting()  # version 3's list entry, which waited
    await repo.views.write(stale, queue=True)  # what version 2 (back to the queue) writes after version 3's
    assert await views(repo, "race") == (False, "Running")
    assert await repo.queued_count(project_id="p") == 0 and await repo.queued_count(user_name="ana") == 0


async def test_tombstones_of_jobs_that_left_the_queue_long_ago_are_swept(counted, monkeypatch):
    repo, _ = counted
    for n in range(3):
        await new_job(repo, f"t{n}")
        await repo.apply_status(status(f"t{n}", 2, Phase.RUNNING, SecondaryPhase.RUNNING))
    await repo.write_waiting()
    assert await repo.queue.count_documents({}) == 3  # tombstones, none counted
    assert await repo.queued_count(project_id="p") == 0
    monkeypatch.setattr("services.submitter.viewentries.SWEEP_EVERY", 1)
    monkeypatch.setattr("services.submitter.viewentries.TOMBSTONE_S", -1.0)
    await new_job(repo, "t3")
    await repo.apply_status(status("t3", 2, Phase.RUNNING, SecondaryPhase.RUNNING))
    assert [d["_id"] async for d in repo.queue.find({})] == ["t3"]  # the others swept; its own tombstone waits


async def test_the_intake_counts_the_queue_once_a_moment_and_never_fewer_than_it_holds(counted):
    repo, commands = counted
    intake = Intake(repo, QueueCaps(per_project=5, per_user=100))

    async def submit(name: str) -> str:
        event = submitted(job_id=unique(name))
        doc = {
            "_id": event.job_id,
            "project_id": "p",
            "name": name,
            "user_name": "ana",
            "create_time": event.create_time,
            "status": {"phase": "Pending"},
            "status_version": 0,
        }
        await intake.store(Arrival(doc, event))
        return event.job_id

    async def stored() -> int:
        """What the queue view holds (the test's own count not counted)."""
        queued = await repo.queued_count(project_id="p")
        commands.sent["aggregate"] -= 1
        return queued

    jobs = [await submit(f"q{n}") for n in range(4)]  # one at a time: a group each
    assert commands.sent["aggregate"] == 2  # the project and the user counted once (twice a group before)
    for job_id in jobs[:2]:  # two start: the count it remembers still holds them
        await repo.apply_status(status(job_id, 1, Phase.RUNNING, SecondaryPhase.RUNNING, previous=Phase.PENDING))
    await repo.write_waiting()
    await submit("q4")  # 4 remembered: room for one
    assert commands.sent["aggregate"] == 2 and await stored() == 3
    await submit("q5")  # 5 remembered would refuse it: counted again (3), so let in
    await submit("q6")
    assert commands.sent["aggregate"] == 3 and await stored() == 5
    with pytest.raises(QueueFull):  # 5 of 5, as counted again
        await submit("q7")
    assert commands.sent["aggregate"] == 4 and await stored() == 5


def chunk(seq: int, *, last: bool = False) -> LogChunk:
    return LogChunk(
        event_id=f"j:1:0:{seq}",
        job_id="j",
        attempt=1,
        rank=0,
        node_id="n",
        seq=seq,
        last=last,
        lines=(LogLine(t=0.0, s="out", line=f"line {seq}"),),
    )


async def test_whether_a_tasks_output_is_all_stored_is_answered_from_memory_or_one_read(counted):
    repo, commands = counted
    await repo.output.add(chunk(0))
    await repo.output.add(chunk(2, last=True))
    assert not await repo.output.complete("j", attempt=1, rank=0)  # chunk 1 still in flight
    await repo.output.add(chunk(1))
    await repo.output.add(chunk(1))  # a redelivery is refused and not counted twice
    commands.sent.clear()
    assert await repo.output.complete("j", attempt=1, rank=0)
    assert commands.total() == 0  # the chunks as this process stored them say so
    other = Repository(db=repo.db, broker=None)  # another replica (or after a restart): one read of the chunks
    assert await other.output.complete("j", attempt=1, rank=0)
    assert commands.total() == 1
    assert not await repo.output.complete("j", attempt=2, rank=0)  # another attempt's output: none stored


async def test_a_task_whose_chunks_skip_a_number_is_not_complete_whatever_their_count(counted):
    repo, _ = counted
    await repo.output.add(chunk(0))
    await repo.output.add(chunk(5))  # past the last: a count of chunks would say "all"
    await repo.output.add(chunk(2, last=True))
    assert not await repo.output.complete("j", attempt=1, rank=0)  # what this replica stored says so too
    other = Repository(db=repo.db, broker=None)
    assert not await other.output.complete("j", attempt=1, rank=0)
    await other.output.add(chunk(1))
    assert await Repository(db=repo.db, broker=None).output.complete("j", attempt=1, rank=0)


async def test_billing_keeps_the_newest_status_of_a_job_in_one_command_each(counted):
    repo, commands = counted
    db = repo.db
    placements = Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked)
    ended = datetime(2026, 11, 25, 1, tzinfo=UTC)
    events = {v: status("j", v, *LIFE[v - 1]) for v in range(1, 6)}
    events[5] = events[5].model_copy(update={"end_time": ended})
    await placements.status(events[2], seen=1.0)  # before billing saw the submission: the record is made
    commands.sent.clear()
    for version in (5, 3, 4, 1, 5):  # then the newest, and older or repeated ones that change nothing
        await placements.status(events[version], seen=2.0)
    assert commands.total() == 1  # the others are older than the one kept: not even sent
    restarted = Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked)
    for version in (3, 4, 1):  # a billing that remembers nothing: the record refuses each, one command each
        await restarted.status(events[version], seen=2.0)
    assert commands.total() == 4
    kept = await db.billing_jobs.find_one({"_id": "j"})
    assert (kept["version"], kept["finished"], kept["final_at"], kept["project_id"]) == (
        5,
        True,
        ended.timestamp(),
        "p",
    )
    await db.billing_jobs.insert_one({"_id": "old", "project_id": "p", "user_name": "ana", "finished": False})
    await placements.status(status("old", 2, Phase.RUNNING, SecondaryPhase.RUNNING), seen=3.0)  # kept before
    assert (await db.billing_jobs.find_one({"_id": "old"}))["version"] == 2  # versions were: it is updated


async def test_billing_writes_only_the_statuses_that_say_something_new_of_a_jobs_attempts(counted):
    repo, commands = counted
    db = repo.db
    placements = Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked)
    await placements.submitted(submitted(job_id="n"))
    ended = datetime(2026, 11, 25, 1, tzinfo=UTC)
    life = [status("n", v, *LIFE[v - 1]).model_copy(update={"attempt": 0 if v == 1 else 1}) for v in range(1, 6)]
    life[4] = life[4].model_copy(update={"end_time": ended})
    commands.sent.clear()
    for event in life:
        await placements.status(event, seen=float(event.version))
    # Pending says what the submission stored; Creating moves to attempt 1, which alone is no news (it was a
    # write); Running twice says nothing new; Completed ends it: one write for five statuses.
    assert commands.total() == 1, dict(commands.sent)
    kept = await db.billing_jobs.find_one({"_id": "n"})
    assert (kept["version"], kept["attempt"], kept["finished"], kept["final_at"]) == (5, 1, True, ended.timestamp())


async def test_billing_knows_on_the_database_server_whether_it_stored_a_placement_first(counted):
    """The upsert's answer says so (`Attempts.started` then reads no ledger); a placement stored before, by an
    earlier process or delivery, is not taken as first."""
    repo, _ = counted
    db = repo.db
    placements = Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked)
    await placements.submitted(submitted(job_id="f"))
    await placements.placed(placed("f"))
    assert placements.first_placed.get("f:1") == set()
    restarted = Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked)
    await restarted.placed(placed("f"))
    assert restarted.first_placed.get("f:1") is None


async def test_a_list_entry_of_a_passing_phase_is_written_later_unless_the_job_ends_first(counted, monkeypatch):
    """A short job's Pending and Running entries wait and are replaced; one whose phase lasts is written a moment
    later, all jobs' in one command; the phase that ends a job is written at once (a page shows it right away)."""
    repo, commands = counted
    # long enough that the four statuses below are applied inside it on a loaded machine (at 0.05 s, the waiting
    # entries were once written in two commands: the wait ran out between long-1's status and long-2's)
    repo.later_entries.delay_s = repo.later_leaves.delay_s = 1.0
    for job_id in ("short", "long-1", "long-2"):
        await new_job(repo, job_id)
    commands.sent.clear()
    await repo.apply_status(status("short", 2, Phase.RUNNING, SecondaryPhase.RUNNING))
    await repo.apply_status(status("short", 3, Phase.COMPLETED, SecondaryPhase.COMPLETED))
    assert (await views(repo, "short"))[1] == "Completed"  # at once, before anything waited out
    await repo.apply_status(status("long-1", 2, Phase.RUNNING, SecondaryPhase.RUNNING))
    await repo.apply_status(status("long-2", 2, Phase.RUNNING, SecondaryPhase.RUNNING))
    assert (await views(repo, "long-1"))[1] == "Pending"  # its Running entry waits
    sent = commands.total()

    async def written() -> bool:
        return commands.total() >= sent + 2

    await eventually(written, timeout_s=10, interval_s=0.05)
    await asyncio.sleep(0.2)  # nothing more follows
    assert commands.total() == sent + 2, dict(commands.sent)  # the waiting list entries in one write, tombstones
    assert await views(repo, "long-1") == (False, "Running") and await views(repo, "long-2") == (False, "Running")
    assert commands.sent["update"] == 1 + 1 + 1  # short's Completed entry; the waiting list entries; 3 tombstones


async def test_a_waiting_list_entry_of_a_deleted_job_does_not_make_it_again(counted):
    repo, _ = counted
    await new_job(repo, "gone")
    await repo.apply_status(status("gone", 2, Phase.RUNNING, SecondaryPhase.RUNNING))  # its entry waits
    await repo.listing.delete_one({"_id": "gone"})  # deleted meanwhile (by another replica, say)
    await repo.write_waiting()
    assert await repo.listing.find_one({"_id": "gone"}) is None


async def test_an_estimate_of_a_job_seen_finishing_here_writes_nothing(counted):
    repo, commands = counted
    await new_job(repo, "e")
    eta = Eta(remaining_s=5, finish_time=datetime(2026, 11, 25, 1, tzinfo=UTC), low_s=1, high_s=9, method="rate")
    commands.sent.clear()
    await repo.apply_eta(EtaEstimated(event_id="e:eta:1", job_id="e", eta=eta))
    assert commands.total() == 1 and (await repo.jobs.find_one({"_id": "e"}))["status"]["eta"]["remaining_s"] == 5
    await repo.apply_status(status("e", 2, Phase.COMPLETED, SecondaryPhase.COMPLETED))
    sent = commands.total()
    await repo.apply_eta(EtaEstimated(event_id="e:eta:2", job_id="e", eta=eta))  # late
    await repo.apply_eta(EtaEstimated(event_id="e:eta:final", job_id="e", eta=None))  # the estimator's last word
    assert commands.total() == sent
    assert (await repo.jobs.find_one({"_id": "e"}))["status"]["eta"] is None
    other = Repository(db=repo.db, broker=None)  # a replica that did not see it finish: refused by the database
    await other.apply_eta(EtaEstimated(event_id="e:eta:3", job_id="e", eta=eta))
    assert (await repo.jobs.find_one({"_id": "e"}))["status"]["eta"] is None


# As the monitor sends them: each status says the phase its job had at the version before.
SAID = [
    (Phase.PENDING, SecondaryPhase.QUEUING, Phase.CREATING),
    (Phase.PENDING, SecondaryPhase.SCHEDULED, Phase.PENDING),
    (Phase.RUNNING, SecondaryPhase.RUNNING, Phase.PENDING),
    (Phase.COMPLETED, SecondaryPhase.COMPLETED, Phase.RUNNING),
]


def said(job_id: str, version: int) -> JobStatusChanged:
    phase, secondary, previous = SAID[version - 1]
    return status(job_id, version, phase, secondary, previous=previous)


async def created(repo: Repository, job_id: str) -> None:
    """A job as the intake stores it: Creating, with its queue and list entries."""
    await new_job(repo, job_id, "Creating", "Creating")


async def test_a_status_that_says_the_phase_before_it_is_written_without_reading_or_answering(counted):
    repo, commands = counted
    await created(repo, "s")
    commands.sent.clear()
    for version in range(1, 5):
        await repo.apply_status(said("s", version))
    # One update a status; Completed's list entry (Pending's and Running's waited and were dropped by it);
    # Running's queue tombstone waits. No findAndModify, no read.
    assert dict(commands.sent) == {"update": 4 + 1}
    await repo.write_waiting()
    assert commands.total() == 6 and await views(repo, "s") == (False, "Completed")
    job = await repo.jobs.find_one({"_id": "s"})
    assert (job["status_version"], job["status"]["phase"]) == (4, "Completed")


async def test_statuses_that_say_the_phase_before_them_end_at_the_latest_whatever_order(counted):
    repo, _ = counted
    for n, order in enumerate([[4, 3, 2, 1], [2, 1, 4, 3], [1, 3, 2, 4], [3, 4, 1, 2]]):
        job_id = f"o{n}"
        await created(repo, job_id)
        await asyncio.gather(*(repo.apply_status(said(job_id, v)) for v in order))
        await asyncio.gather(*(repo.apply_status(said(job_id, v)) for v in order))  # every one redelivered
        await repo.write_waiting()
        assert await views(repo, job_id) == (False, "Completed"), order
        assert (await repo.jobs.find_one({"_id": job_id}))["status"]["phase"] == "Completed"
    await created(repo, "back")
    for version in (1, 2, 3):
        await repo.apply_status(said("back", version))
    # Back to the queue: a status that puts the job in the queue is written as before (the job read back), so a
    # deleted job's late one makes it no place in the queue.
    await repo.apply_status(status("back", 4, Phase.PENDING, SecondaryPhase.QUEUING, previous=Phase.RUNNING))
    await repo.write_waiting()
    assert await views(repo, "back") == (True, "Pending") and await repo.queued_count(user_name="ana") == 1


async def test_the_statuses_of_jobs_that_come_together_are_written_together(counted):
    repo, commands = counted
    jobs = [f"together-{n}" for n in range(20)]
    for job_id in jobs:
        await created(repo, job_id)
        for version in (1, 2):
            await repo.apply_status(said(job_id, version))
    commands.sent.clear()
    await asyncio.gather(*(repo.apply_status(said(job_id, 3)) for job_id in jobs))  # Running
    # 20 job writes and 20 queue tombstones, in groups (one command each); each was a findAndModify and an update
    assert commands.sent["findAndModify"] == 0 and commands.total() <= 3, dict(commands.sent)
    assert await repo.queued_count(project_id="p") == 20  # they left the queue, counted a moment longer
    await repo.write_waiting()  # their tombstones, in one write
    assert commands.total() <= 4 and await repo.queued_count(project_id="p") == 0
    assert {(await repo.jobs.find_one({"_id": job_id}))["status"]["phase"] for job_id in jobs} == {"Running"}


async def test_a_late_status_of_a_deleted_job_makes_it_no_entries(counted):
    repo, _ = counted
    await created(repo, "d")
    for version in (1, 2, 3, 4):
        await repo.apply_status(said("d", version))
    assert await repo.delete("d", finished=["Completed"])
    for version in (3, 4):  # redelivered after the job was deleted
        await repo.apply_status(said("d", version))
    await repo.write_waiting()
    assert await repo.listing.find_one({"_id": "d"}) is None and await repo.jobs.find_one({"_id": "d"}) is None
    assert await repo.queued_count(project_id="p") == 0


async def no_budgets(project_id: str) -> None:
    pass


def billing_over(db, *, clock) -> Billing:
    return build(
        ledger=db.billing_ledger,
        ends=db.billing_ends,
        nodes=db.billing_nodes,
        nodes_open=db.billing_nodes_open,
        node_info=db.billing_node_info,
        quotas=db.billing_quotas,
        alerts=DocumentStore(db.billing_alerts, None),
        placements=Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked),
        static=None,
        clock=clock,
    )


async def test_an_attempts_line_is_one_document_inserted_open_and_replaced_closed(counted):
    """Billing's line of an attempt on the database server: one insert when it starts, one replace when it ends
    (it was an insert, then an insert into the ledger and a delete); the sums read only closed lines, what runs is
    read from memory, and a billing that starts again reads the open lines back."""
    repo, commands = counted
    db, now = repo.db, T0 + timedelta(hours=3)
    billing = billing_over(db, clock=lambda: now)
    billing.attempts.spent = no_budgets
    await billing.lifetimes.registered(NodeRegistered(event_id="n1:r", node=node(node_id="n1"), boot_id="b"))
    for job_id in ("a", "b"):
        await billing.attempts.submitted(submitted(job_id=job_id))
        await billing.attempts.placed(placed(job_id))
    commands.sent.clear()
    await billing.attempts.started(started("a"), seen=T0)
    await billing.attempts.started(started("b"), seen=T0)
    await billing.attempts.exited(exited("a"), seen=T0 + timedelta(hours=2))
    await billing.attempts.started(started("a"), seen=T0 + timedelta(hours=2))  # a start seen again: nothing
    assert dict(commands.sent) == {"insert": 2, "update": 1}, dict(commands.sent)
    report = await billing.reports.usage(UsageQuery(project_id="p"))
    assert (report.total.attempts, report.open_attempts) == (2, 1)  # a closed, b running for 3 h so far
    assert report.total.cost == pytest.approx(2.0 + 3.0)
    again = billing_over(db, clock=lambda: now)  # a billing that starts again
    assert await again.attempts.load() == 1 and list(again.attempts.running) == ["b:1:0"]
    await again.attempts.exited(exited("b"), seen=T0 + timedelta(hours=3))
    closed = await db.billing_ledger.find_one({"_id": "b:1:0"})
    assert "open" not in closed and closed["cost"] == pytest.approx(3.0)
    assert (await again.reports.usage(UsageQuery(project_id="p"))).total.cost == pytest.approx(5.0)


async def test_lines_written_before_closes_were_stamped_are_summed_and_later_closes_stamp_after_the_latest(counted):
    """On the database server: a closed line of an earlier version (no stamp) is stamped 0 at the start and summed;
    a leader whose clock is behind the one before it stamps its closes after the ledger's latest, so each report
    sums them too."""
    repo, _ = counted
    db, now = repo.db, T0 + timedelta(hours=3)
    old = close_entry(
        open_entry(
            key={"job_id": "old", "attempt": 1, "rank": 0},
            terms={"node_id": "n1", "node_kind": "local", "gpu_count": 1, "node_gpu_count": 1, "price_per_hour": 1.0},
            project_id="p",
            user_name="alice",
            started_at=T0,
        ),
        ended_at=T0 + timedelta(hours=1),
        reason="completed",
    )
    del old[STAMP]
    older = {k: v for k, v in old.items() if k not in ("t0", "t1")} | {"_id": "older:1:0", "job_id": "older"}
    ahead = {**old, "_id": "ahead:1:0", "job_id": "ahead", STAMP: 4e9}  # stamped by a leader far ahead
    await db.billing_ledger.insert_many([old, older, ahead])
    billing = billing_over(db, clock=lambda: now)
    billing.attempts.spent = no_budgets
    assert await billing.attempts.backfill_epochs() == 2  # old: its stamp; older: its stamp and its bounds
    assert (await db.billing_ledger.find_one({"_id": "old:1:0"}))[STAMP] == 0.0
    stored = await db.billing_ledger.find_one({"_id": "older:1:0"})
    assert stored[STAMP] == 0.0 and (stored["t0"], stored["t1"]) == (old["t0"], old["t1"])
    assert await billing.attempts.backfill_epochs() == 0  # a second start finds nothing to give
    assert await billing.attempts.load() == 0
    assert (await billing.reports.usage(UsageQuery(project_id="p"))).total.attempts == 3
    await billing.lifetimes.registered(NodeRegistered(event_id="n1:r", node=node(node_id="n1"), boot_id="b"))
    await billing.attempts.submitted(submitted(job_id="a"))
    await billing.attempts.placed(placed("a"))
    await billing.attempts.started(started("a"), seen=T0)
    await billing.attempts.exited(exited("a"), seen=T0 + timedelta(hours=2))
    assert (await db.billing_ledger.find_one({"_id": "a:1:0"}))[STAMP] > 4e9
    report = await billing.reports.usage(UsageQuery(project_id="p"))
    assert (report.total.attempts, report.open_attempts) == (4, 0) and report.total.cost == pytest.approx(5.0)


async def test_billings_records_of_jobs_that_come_a_moment_apart_share_a_write(counted):
    """At a few jobs a second billing's handlers of different jobs write a moment apart: each record and line waits
    `WRITE_WINDOW_S` for the others, so three jobs submitted, placed, started and ended 50 ms apart cost one command
    for each of the four steps, not one for each job's (twelve)."""
    repo, commands = counted
    db, now = repo.db, T0 + timedelta(hours=3)
    billing = billing_over(db, clock=lambda: now)
    billing.attempts.spent = no_budgets
    await billing.lifetimes.registered(NodeRegistered(event_id="n1:r", node=node(node_id="n1"), boot_id="b"))
    jobs = [unique("w") for _ in range(3)]

    async def apart(step) -> None:
        async def one(n: int, job_id: str) -> None:
            await asyncio.sleep(0.05 * n)
            await step(job_id)

        await asyncio.gather(*(one(n, job_id) for n, job_id in enumerate(jobs)))

    commands.sent.clear()
    await apart(lambda job_id: billing.attempts.submitted(submitted(job_id=job_id, gpu_count=1)))
    await apart(lambda job_id: billing.attempts.placed(placed(job_id)))
    await apart(lambda job_id: billing.attempts.started(started(job_id), seen=T0))
    await apart(lambda job_id: billing.attempts.exited(exited(job_id), seen=T0 + timedelta(hours=1)))
    # the parked task events looked for once, by the first placement (by each of the three at once before)
    assert dict(commands.sent) == {"insert": 3, "update": 1, "find": 1}, dict(commands.sent)
    report = await billing.reports.usage(UsageQuery(project_id="p"))
    assert (report.total.attempts, report.open_attempts) == (3, 0)


async def test_lines_kept_open_in_the_old_collection_are_moved_into_the_ledger(counted):
    repo, _ = counted
    db = repo.db
    line = open_entry(
        key={"job_id": "old", "attempt": 1, "rank": 0},
        terms={"node_id": "n1", "node_kind": "local", "price_per_hour": 1.0, "gpu_count": 0, "node_gpu_count": 0},
        project_id="p",
        user_name="alice",
        started_at=T0,
    )
    await db.billing_open.insert_one({k: v for k, v in line.items() if k != "open"})
    assert await move_open_lines(db.billing_open, db.billing_ledger) == 1
    assert await move_open_lines(db.billing_open, db.billing_ledger) == 0  # a second start moves nothing
    billing = billing_over(db, clock=lambda: T0 + timedelta(hours=1))
    assert await billing.attempts.load() == 1 and await db.billing_open.count_documents({}) == 0


async def test_audit_records_begun_and_finished_together_are_written_together(counted):
    """A submission's record before the change and its outcome after: a burst's (the intake stores its jobs in one
    group, so their requests finish together) share one write each way; a lone one is written at once."""
    repo, commands = counted
    audit_log = AuditLog(repo.db.api_audit)
    begin = {"principal": None, "method": "POST", "path": "/v2/p/training-jobs", "template": "", "client_ip": ""}
    commands.sent.clear()
    ids = await asyncio.gather(
        *(audit_log.begin(action="job.create", project_id="p", target_id=None, **begin) for _ in range(20))
    )
    assert commands.sent["insert"] <= 3, dict(commands.sent)  # 20 records in groups
    await asyncio.gather(
        *(
            audit_log.finish(i, action="job.create", status=201, target_id=f"j{n}", summary={})
            for n, i in enumerate(ids)
        )
    )
    assert commands.sent["update"] <= 3, dict(commands.sent)
    stored = {d["_id"]: d async for d in repo.db.api_audit.find({})}
    assert len(stored) == 20 and {d["state"] for d in stored.values()} == {"done"}
    assert isinstance(stored[ids[0]]["at"], datetime)  # inserted, not $set: a datetime stays one on the server


async def test_inserts_made_together_go_in_one_write_each_told_whether_it_was_refused(counted):
    """What a document's first state, billing's record of a job and an attempt's line are stored by: a burst's
    inserts share one command, and each learns whether a unique index refused it (a redelivery: stored before)."""
    repo, commands = counted
    collection = repo.db.grouped_inserts
    await collection.insert_one({"_id": "j3"})
    commands.sent.clear()
    answers = await asyncio.gather(*(insert_grouped(collection, {"_id": f"j{n}", "n": n}) for n in range(8)))
    assert answers == [n != 3 for n in range(8)]
    assert commands.sent["insert"] <= 2, dict(commands.sent)  # the first alone, the rest together
    assert await collection.count_documents({}) == 8 and (await collection.find_one({"_id": "j3"})).get("n") is None
    assert await insert_grouped(collection, {"_id": "j9"}) and not await insert_grouped(collection, {"_id": "j9"})


async def test_conditional_replacements_made_together_go_in_one_write_each_told_whether_it_matched(counted):
    """What a state machine's change of a job is stored by (`DocumentStore`): a burst's share one command; where
    one lost a race (its document changed since it was read), the command's answer tells which."""
    repo, commands = counted
    collection = repo.db.grouped_replacements
    await collection.insert_many([{"_id": f"j{n}", "rev": 1} for n in range(6)])

    def change(n: int, rev: int) -> Any:
        return replace_if(collection, {"_id": f"j{n}", "rev": rev}, {"rev": rev + 1})

    commands.sent.clear()
    assert await asyncio.gather(*(change(n, 1) for n in range(6))) == [True] * 6
    written = commands.sent["update"] + commands.sent["bulkWrite"]
    assert written <= 2 and "find" not in commands.sent, dict(commands.sent)  # one alone, the rest
    commands.sent.clear()
    answers = await asyncio.gather(*(change(n, 1 if n in (2, 4) else 2) for n in range(6)))  # 2 and 4: stale
    assert answers == [n not in (2, 4) for n in range(6)]
    assert {d["_id"]: d["rev"] async for d in collection.find({})} == {f"j{n}": 3 for n in range(6)} | {
        "j2": 2,
        "j4": 2,
    }


async def test_chunks_of_output_stored_together_share_one_insert_and_write_nothing_else(counted):
    repo, commands = counted
    chunks = [chunk(0).model_copy(update={"job_id": f"out-{n}", "event_id": f"out-{n}:1:0:0"}) for n in range(10)]
    commands.sent.clear()
    await asyncio.gather(*(repo.output.add(c) for c in chunks + chunks[:3]))  # three of them delivered twice
    assert commands.sent["insert"] <= 3, dict(commands.sent)  # one alone, the rest in groups
    assert commands.total() == commands.sent["insert"]  # each chunk's counter was a findAndModify of its own
    assert [repo.output.counts.get(f"out-{n}")["chunks_1_0"] for n in range(10)] == [1] * 10  # counted once
    assert await repo.output.chunks.count_documents({}) == 10


async def test_a_start_whose_line_landed_though_its_answer_was_lost_is_still_closed_by_its_end(counted, monkeypatch):
    """The line was stored but this billing did not learn it (the answer lost, or the write group failed after it
    landed): the start's redelivery finds it stored and open, and its end closes it (it stayed open, uncharged)."""
    repo, _ = counted
    real_insert = attempts_module.insert_grouped

    async def lands_then_raises(collection, doc, **kwargs):
        await real_insert(collection, doc, **kwargs)
        monkeypatch.setattr(attempts_module, "insert_grouped", real_insert)
        raise AutoReconnect("the answer was lost")

    monkeypatch.setattr(attempts_module, "insert_grouped", lands_then_raises)
    db, now = repo.db, T0 + timedelta(hours=3)
    billing = billing_over(db, clock=lambda: now)
    billing.attempts.spent = no_budgets
    await billing.lifetimes.registered(NodeRegistered(event_id="n1:r", node=node(node_id="n1"), boot_id="b"))
    await billing.attempts.submitted(submitted(job_id="a"))
    await billing.attempts.placed(placed("a"))
    with pytest.raises(AutoReconnect):
        await billing.attempts.started(started("a"), seen=T0)
    await billing.attempts.started(started("a"), seen=T0)  # the redelivery: the insert is refused
    await billing.attempts.exited(exited("a"), seen=T0 + timedelta(hours=2))
    closed = await db.billing_ledger.find_one({"_id": "a:1:0"})
    assert "open" not in closed and closed["cost"] == pytest.approx(2.0)


async def test_view_entries_whose_write_failed_wait_and_go_out_with_the_next_try(counted, monkeypatch):
    """A deferred write that fails (the database away a moment) keeps its entries waiting; they were lost before,
    leaving a job counted in its queue or shown in an old phase until a restart."""
    repo, _ = counted
    entries = repo.db.later_test
    await entries.insert_one({"_id": "w", "v": 1, "phase": "Pending"})
    real_update = later_module.update_grouped
    fails = [AutoReconnect("the database went away")]

    async def fails_once(collection, updates, **kw):
        if fails:
            raise fails.pop()
        return await real_update(collection, updates, **kw)

    monkeypatch.setattr(later_module, "update_grouped", fails_once)
    later = later_module.LaterWrites(entries, delay_s=0.05)
    later.add("w", 2, {"$set": {"v": 2, "phase": "Running"}})

    async def written():
        return (await entries.find_one({"_id": "w"}))["phase"] == "Running"

    await eventually(written, timeout_s=5)
    assert not fails and not later.waiting


async def test_a_deleted_jobs_id_is_kept_by_placement_for_a_day_in_one_command(counted):
    """Placement's record of a deleted job becomes its id and when (one replace, as the delete was), which refuses
    its submission delivered again; the next start purges such ids older than a day, and nothing else."""
    repo, commands = counted
    queue = JobQueue(DocumentStore(repo.db.placement_jobs, None))
    for job_id in ("kept", "gone", "old"):
        assert await queue.add(QueueItem.model_validate({**ITEM, "job_id": job_id}))
        await queue.save(queue.items[job_id].model_copy(update={"state": "done"}), [])
    before = commands.total()
    await queue.forget("gone", now=T0 + timedelta(hours=23))
    assert commands.total() - before == 1
    await queue.forget("old", now=T0)
    assert not await queue.add(QueueItem.model_validate({**ITEM, "job_id": "gone"}))  # delivered again: refused
    await JobQueue(queue.store).load(now=T0 + timedelta(hours=24, seconds=1))
    stored = {d["_id"]: d async for d in repo.db.placement_jobs.find({})}
    assert set(stored) == {"kept", "gone"} and set(stored["gone"]) == {"_id", "state", "deleted_t"}
    assert stored["kept"]["state"] == "done" and "spec" in stored["kept"]


async def test_a_running_placement_leader_purges_old_deleted_ids_every_while_and_survives_a_database_error(counted):
    # they were purged only at a leader's start: one up for months kept every id deleted since
    repo, _ = counted
    queue = JobQueue(DocumentStore(repo.db.placement_jobs, None))
    for job_id in ("old", "young"):
        assert await queue.add(QueueItem.model_validate({**ITEM, "job_id": job_id}))
        await queue.save(queue.items[job_id].model_copy(update={"state": "done"}), [])
    now = datetime.now(UTC)
    await queue.forget("old", now=now - timedelta(hours=25))
    await queue.forget("young", now=now - timedelta(hours=1))
    real, fails = queue.purge, [AutoReconnect("the database went away")]

    async def purge(*, now):
        if fails:
            raise fails.pop()
        await real(now=now)

    queue.purge = purge  # type: ignore[method-assign]
    loop = asyncio.create_task(purge_loop(queue, every_s=0.05))
    try:

        async def purged():
            return await repo.db.placement_jobs.find_one({"_id": "old"}) is None

        await eventually(purged, timeout_s=5)
    finally:
        loop.cancel()
    assert not fails and await repo.db.placement_jobs.find_one({"_id": "young"}) is not None


async def test_lines_across_a_reports_edges_are_counted_clipped_on_the_database_server(counted):
    """A report over a window (a month's spend, for admission and budgets) counts the part inside it of the lines
    that began before it or end after it. On the embedded server a `find` joining a datetime range with `$ne` matched
    nothing, and every such line was left out (the edges are read on Unix seconds now)."""
    repo, _ = counted
    db = repo.db
    terms = {"node_id": "n1", "node_kind": "local", "gpu_count": 1, "node_gpu_count": 1, "price_per_hour": 1.0}

    def line(job_id: str, start_h: float, end_h: float) -> dict:
        opened = open_entry(
            key={"job_id": job_id, "attempt": 1, "rank": 0},
            terms=terms,
            project_id="p",
            user_name="alice",
            started_at=T0 + timedelta(hours=start_h),
        )
        return close_entry(opened, ended_at=T0 + timedelta(hours=end_h), reason="completed")

    # before the window, across its start, inside, across its end, across both, after it
    await db.billing_ledger.insert_many(
        [line("before", 0, 1), line("into", 1, 3), line("inside", 3, 4), line("out", 4, 7), line("over", 0, 9)]
        + [line("after", 7, 8)]
    )
    billing = billing_over(db, clock=lambda: T0 + timedelta(hours=10))
    window = {"start": T0 + timedelta(hours=2), "end": T0 + timedelta(hours=6)}
    for spend_only in (False, True):
        report = await billing.reports.usage(UsageQuery(project_id="p", **window), spend_only=spend_only)
        assert report.total.attempts == 4  # into, inside, out, over
        assert report.total.seconds == pytest.approx((1 + 1 + 2 + 4) * 3600)
        assert report.total.cost == pytest.approx(8.0)
