"""A graceful stop of the API writes the view entries that wait (`LaterWrites.close`), once its bus handlers stopped
and before its database client closes; a database that does not answer holds the stop for a bounded time only (the
next start rebuilds the views). They were dropped with the process: a job listed in its previous phase, or counted
in its queue cap, until that next start."""

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from pymongo.errors import AutoReconnect

from shared import service as service_module
from shared.events import JobStatusChanged
from shared.jobs import Phase, SecondaryPhase
from shared.service import Background, BusLink, Wiring
from services.submitter import app as app_module
from services.submitter.app import SubmitterSettings, create_app
from services.submitter.later import LaterWrites
from tests.conftest import eventually
from tests.memory import MemoryCollection
from tests.unit.api_app import ADMIN_TOKEN, Db


class Broker:
    """A bus that is never reached: what starts and stops, in order."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.context = SimpleNamespace(set_global=lambda name, value: None)

    async def start(self) -> None:
        self.order.append("bus started")

    async def stop(self) -> None:
        self.order.append("bus stopped")


class Client:
    def __init__(self, db: Db, order: list[str]) -> None:
        self.db, self.order = db, order

    def __getitem__(self, name: str) -> Db:
        return self.db

    async def close(self) -> None:
        self.order.append("database closed")


def creating(job_id: str) -> JobStatusChanged:
    """A phase that does not end the job: its list entry waits."""
    return JobStatusChanged(
        event_id=f"{job_id}:status:2",
        job_id=job_id,
        project_id="p",
        user_name="ana",
        version=2,
        phase=Phase.CREATING,
        secondary_phase=SecondaryPhase.CREATING,
        previous_phase=Phase.PENDING,
    )


async def test_a_graceful_stop_writes_the_entries_that_wait_after_the_bus_and_before_the_database(
    monkeypatch, tmp_path
):
    order: list[str] = []
    db = Db()

    async def connected(*args, **kwargs) -> None:
        order.append("bus connected")

    wiring = Wiring(name="submitter", broker=Broker(order), background=Background(), link=BusLink())
    monkeypatch.setattr(app_module, "wire", lambda **kwargs: wiring)
    monkeypatch.setattr(service_module, "connect", connected)
    monkeypatch.setattr(service_module, "bound", lambda *args, **kwargs: asyncio.sleep(0))  # nothing it reads
    monkeypatch.setattr(service_module, "make_client", lambda url: Client(db, order))
    app = create_app(SubmitterSettings(admin_token=ADMIN_TOKEN, data_dir=tmp_path, nats_url="nats://127.0.0.1:1"))
    async with app.router.lifespan_context(app):
        repo = app.state.submitter.repo
        await repo.jobs.insert_one(
            {
                "_id": "j",
                "name": "j",
                "project_id": "p",
                "user_name": "ana",
                "status_version": 1,
                "status": {"phase": "Pending", "secondary_phase": "Queuing"},
                "create_time": datetime(2026, 11, 25, tzinfo=UTC),
            }
        )
        await repo.sync_views("j")
        await repo.apply_status(creating("j"))
        assert repo.later_entries.waiting and (await db.api_job_list.find_one({"_id": "j"}))["phase"] == "Pending"
        written = db.api_job_list.update_one

        async def noted(*args, **kwargs):
            order.append("entry written")
            return await written(*args, **kwargs)

        db.api_job_list.update_one = noted
    assert (await db.api_job_list.find_one({"_id": "j"}))["phase"] == "Creating"
    assert order == ["bus connected", "bus started", "bus stopped", "entry written", "database closed"]


class Slow(MemoryCollection):
    """A database that answers a write later than a stop waits (answering at all: the group writer, which the
    loop's other writes share, is not left waiting for ever)."""

    async def update_one(self, *args, **kwargs):
        await asyncio.sleep(0.5)
        return await super().update_one(*args, **kwargs)


async def test_a_stop_waits_for_a_database_that_does_not_answer_only_so_long(caplog):
    later = LaterWrites(Slow("api_job_list"), delay_s=60)
    later.add("j", 2, {"$set": {"phase": "Creating", "v": 2}})
    await later.close(timeout_s=0.05)  # returns: the views are rebuilt at the next start
    assert "1 view entries not written to api_job_list at stop" in caplog.text
    await asyncio.sleep(0.6)  # the write handed over ends (the next test's writes share its loop's group writer)


class CutOff(MemoryCollection):
    """A database whose first write is under way until `answer` is set, and then fails (the connection lost);
    the next ones are written."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.under_way, self.answer, self.failed = asyncio.Event(), asyncio.Event(), False

    async def update_one(self, *args, **kwargs):
        if not self.failed:
            self.failed = True
            self.under_way.set()
            await self.answer.wait()
            raise AutoReconnect("connection reset")
        return await super().update_one(*args, **kwargs)


async def test_a_stop_waits_for_the_write_the_timer_started_and_writes_what_it_put_back():
    """The timer's write was under way when the stop came: the stop found nothing waiting and returned at once, the
    client closed under that write, and what it put back was written by nobody."""
    collection = CutOff("api_job_list")
    await collection.insert_one({"_id": "j", "phase": "Pending", "v": 1})
    later = LaterWrites(collection, delay_s=0)
    later.add("j", 2, {"$set": {"phase": "Creating", "v": 2}})
    await collection.under_way.wait()
    later.delay_s = 60  # what the failed write puts back would wait past the end of the test
    stop = asyncio.create_task(later.close(timeout_s=5))
    await asyncio.sleep(0)  # the stop has begun
    collection.answer.set()
    await stop
    assert (await collection.find_one({"_id": "j"}))["phase"] == "Creating" and not later.waiting
    assert later._timer is None  # nothing is written after the stop


async def test_the_timers_write_failing_after_a_stop_that_stopped_waiting_for_it_starts_no_timer(caplog):
    """The stop gave up on the timer's write under way (the database slow to answer); that write then failed and
    put its entries back, which started a timer: a write after the stop, again and again while the database fails."""
    collection = CutOff("api_job_list")
    await collection.insert_one({"_id": "j", "phase": "Pending", "v": 1})
    later = LaterWrites(collection, delay_s=0)
    later.add("j", 2, {"$set": {"phase": "Creating", "v": 2}})
    await collection.under_way.wait()
    later.delay_s = 60  # a timer started now would still be waiting when the test looks
    await later.close(timeout_s=0.05)  # returns while the timer's write is still under way
    assert "view entries not written to api_job_list at stop" in caplog.text
    collection.answer.set()  # that write fails now and puts its entry back

    async def put_back() -> bool:
        return bool(later.waiting)

    await eventually(put_back, interval_s=0.01)
    assert later._timer is None  # nothing is written after the stop
