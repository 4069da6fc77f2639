"""The search driver on an in-memory store and a fake submitter: trials start up to parallelism, losing ones are
pruned and told to end, a restarted driver asks nothing twice, a stop ends the search."""

import asyncio
import math
from dataclasses import dataclass, field

import pytest

from services.submitter.searches.driver import Driver, Submitted
from services.submitter.searches.models import TRIAL_REASON_CHARS, SearchCreate
from services.submitter.searches.store import SearchStore
from tests.memory import MemoryCollection

T0 = 1_800_000_000_000


def search_doc(*, pruner: str = "none", max_trials: int = 4, parallelism: int = 2, **extra) -> dict:
    spec = SearchCreate.model_validate(
        {
            "name": "sweep",
            "template": {"metadata": {"name": "x"}, "algorithm": {"command": "train"}},
            "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True}},
            "objective": {"metric": "loss", "mode": "min", "max_step": 20},
            "max_trials": max_trials,
            "parallelism": parallelism,
            "pruner": pruner,
            **extra,
        }
    )
    return {
        "_id": "s-unit",
        "project_id": "p",
        "name": "sweep",
        "user_name": "ana",
        "create_time": None,
        "spec": spec.model_dump(mode="json"),
        "seed": 7,
        "phase": "Running",
        "trials": [],
        "best": None,
        "dollars_per_hour": 2.0,
    }


@dataclass
class FakePort:
    """Jobs as the submitter's view would show them; each trial's loss floor is set per trial number."""

    floors: dict[int, float] = field(default_factory=dict)
    jobs: dict[str, dict] = field(default_factory=dict)
    submitted: list[str] = field(default_factory=list)
    terminated: list[tuple[str, str]] = field(default_factory=list)
    steps: dict[str, int] = field(default_factory=dict)
    refuse: Submitted | None = None

    async def submit(self, search, *, trial, job_id, parameters):
        if self.refuse:
            raise self.refuse
        assert job_id not in self.jobs, "a trial was submitted twice"
        self.submitted.append(job_id)
        self.jobs[job_id] = {
            "_id": job_id,
            "status": {"phase": "Running", "start_time": T0, "end_time": 0},
            "spec": {"resource": {"gpu_count": 1, "node_count": 1}},
            "trial": trial,
        }
        self.steps[job_id] = 0

    async def job(self, job_id):
        return self.jobs.get(job_id)

    async def points(self, job_id, *, metric):
        floor = self.floors.get(self.jobs[job_id]["trial"], 1.0)
        return [(T0 / 1000 + s, floor + 2 * math.exp(-s / 4), float(s)) for s in range(1, self.steps[job_id] + 1)]

    async def terminate(self, job_id, *, requested_by):
        self.terminated.append((job_id, requested_by))
        self.jobs[job_id]["status"].update(phase="Terminated", end_time=T0 + 1000)

    def advance(self, steps: int) -> None:
        for job_id, job in self.jobs.items():
            if job["status"]["phase"] != "Running":
                continue
            self.steps[job_id] = min(20, self.steps[job_id] + steps)
            if self.steps[job_id] == 20:
                job["status"].update(phase="Completed", end_time=T0 + 3_600_000)


async def started(doc: dict) -> tuple[SearchStore, dict]:
    store = SearchStore(MemoryCollection("api_searches"))
    await store.insert(doc)
    return store, await store.get("p", doc["_id"])


@pytest.mark.asyncio
async def test_trials_start_up_to_parallelism_with_deterministic_ids_and_the_search_completes():
    store, _ = await started(search_doc())
    port = FakePort()
    driver = Driver(store=store, port=port)
    await driver.pass_once(now_ms=T0)
    assert port.submitted == ["s-unit-t0", "s-unit-t1"]
    for _ in range(6):
        port.advance(20)
        await driver.pass_once(now_ms=T0 + 3_700_000)
    doc = await store.get("p", "s-unit")
    assert port.submitted == [f"s-unit-t{k}" for k in range(4)]
    assert doc["phase"] == "Completed" and [t["state"] for t in doc["trials"]] == ["Completed"] * 4
    assert doc["best"]["value"] == pytest.approx(1.0 + 2 * math.exp(-5))
    assert doc["gpu_hours"] == pytest.approx(4.0) and doc["dollars"] == pytest.approx(8.0)


@pytest.mark.asyncio
async def test_parameters_are_the_same_for_the_same_seed_and_trial():
    store, _ = await started(search_doc())
    await Driver(store=store, port=FakePort()).pass_once(now_ms=T0)
    other, _ = await started(search_doc())
    await Driver(store=other, port=FakePort()).pass_once(now_ms=T0)
    assert (await store.get("p", "s-unit"))["trials"][0]["parameters"] == (await other.get("p", "s-unit"))["trials"][0][
        "parameters"
    ]


@pytest.mark.asyncio
async def test_a_losing_trial_is_pruned_terminated_with_the_reason_and_stays_pruned():
    store, _ = await started(search_doc(pruner="predicted", max_trials=3, parallelism=1))
    port = FakePort(floors={0: 0.1, 1: 3.0, 2: 0.05})
    driver = Driver(store=store, port=port)
    for _ in range(12):
        port.advance(5)
        await driver.pass_once(now_ms=T0 + 3_700_000)
    doc = await store.get("p", "s-unit")
    assert [t["state"] for t in doc["trials"]] == ["Completed", "Pruned", "Completed"]
    assert port.terminated[0][0] == "s-unit-t1" and "predicted" in port.terminated[0][1]
    assert doc["best"]["trial"] == 2 and doc["phase"] == "Completed"


@pytest.mark.asyncio
async def test_a_restarted_driver_submits_a_stored_but_unsubmitted_trial_once():
    store, doc = await started(search_doc(max_trials=1, parallelism=1))
    port = FakePort(refuse=Submitted("503 billing away", retry=True))
    await Driver(store=store, port=port).pass_once(now_ms=T0)
    doc = await store.get("p", "s-unit")
    assert doc["trials"][0]["submitted"] is False and "billing away" in doc["message"]
    port.refuse = None
    fresh = Driver(store=store, port=port)  # a new process: nothing in memory
    await fresh.pass_once(now_ms=T0 + 2_000)  # the refusal's wait past
    await fresh.pass_once(now_ms=T0 + 2_000)
    assert port.submitted == ["s-unit-t0"]


@pytest.mark.asyncio
async def test_a_pass_asks_no_more_once_a_trial_is_refused_for_now():
    """A full queue refuses every trial alike: each was asked anyway, its checks (DNS included) and its questions to
    placement and billing every two seconds for every search (found by review)."""
    store, _ = await started(search_doc(max_trials=8, parallelism=8))
    asked: list[str] = []
    port = FakePort(refuse=Submitted("409 the project's queue is full", retry=True))
    refuse = port.submit

    async def counting(search, *, trial, job_id, parameters):
        asked.append(job_id)
        return await refuse(search, trial=trial, job_id=job_id, parameters=parameters)

    port.submit = counting
    driver = Driver(store=store, port=port)
    await driver.pass_once(now_ms=T0)
    await driver.pass_once(now_ms=T0 + 1_000)  # within the first refusal's 2-s wait: not asked
    await driver.pass_once(now_ms=T0 + 2_000)
    assert asked == ["s-unit-t0", "s-unit-t0"]
    for k in range(6):  # refused in a row: each wait twice the last, up to 5 minutes
        await driver.pass_once(now_ms=T0 + 2_000 + 2_000 * 2 ** (k + 1) - 1)
        await driver.pass_once(now_ms=T0 + 2_000 + sum(2_000 * 2 ** (j + 1) for j in range(k + 1)))
    assert len(asked) == 8  # one more a wait, none early
    port.refuse = None
    await driver.pass_once(now_ms=T0 + 10**7)
    assert port.submitted == [f"s-unit-t{i}" for i in range(8)]  # all of them once there is room


@pytest.mark.asyncio
async def test_an_invalid_trial_fails_and_does_not_block_the_search():
    store, _ = await started(search_doc(max_trials=2, parallelism=2))
    port = FakePort(refuse=Submitted("400 param[spec] invalid", retry=False))
    driver = Driver(store=store, port=port)
    await driver.pass_once(now_ms=T0)
    await driver.pass_once(now_ms=T0)
    doc = await store.get("p", "s-unit")
    assert [t["state"] for t in doc["trials"]] == ["Failed", "Failed"] and doc["phase"] == "Completed"


@pytest.mark.asyncio
async def test_a_trials_reason_is_kept_short_in_the_searchs_record():
    """A trial's job may end with 16 KiB of its last lines: 1,000 of them passed the 16-MiB document a search's
    trials live in (the whole reason stays on the trial's job)."""
    store, _ = await started(search_doc(max_trials=1, parallelism=1))
    port = FakePort(refuse=Submitted("400 " + "x" * 20_000, retry=False))
    driver = Driver(store=store, port=port)
    await driver.pass_once(now_ms=T0)
    doc = await store.get("p", "s-unit")
    assert doc["trials"][0]["state"] == "Failed" and len(doc["trials"][0]["reason"]) == TRIAL_REASON_CHARS


@pytest.mark.asyncio
async def test_stop_terminates_running_trials_and_starts_no_more():
    store, _ = await started(search_doc(max_trials=6, parallelism=2))
    port = FakePort()
    driver = Driver(store=store, port=port)
    await driver.pass_once(now_ms=T0)
    assert await store.request_stop("p", "s-unit", by="ana")
    await driver.pass_once(now_ms=T0)
    await driver.pass_once(now_ms=T0)
    doc = await store.get("p", "s-unit")
    assert doc["phase"] == "Stopped" and len(doc["trials"]) == 2
    assert sorted(j for j, _ in port.terminated) == ["s-unit-t0", "s-unit-t1"]
    assert not await store.request_stop("p", "s-unit", by="ana")


@pytest.mark.asyncio
async def test_gpu_hour_budget_stops_new_trials():
    store, _ = await started(search_doc(max_trials=10, parallelism=1, max_gpu_hours=1.5))
    port = FakePort()
    driver = Driver(store=store, port=port)
    for _ in range(6):
        port.advance(20)
        await driver.pass_once(now_ms=T0 + 3_700_000)
    doc = await store.get("p", "s-unit")
    assert len(doc["trials"]) == 2 and doc["phase"] == "Completed" and "max_gpu_hours" in doc["reason"]


class CountedStore(SearchStore):
    """A store that counts its reads of the running searches."""

    reads: int = 0

    async def running(self) -> list[dict]:
        self.reads += 1
        return await super().running()


async def test_with_no_search_running_the_driver_reads_them_only_now_and_then_or_after_one_is_stored_here():
    """At rest the running searches are read every `idle_s`, not at every pass (every 2 s, a scan of the
    collection on the embedded database); a search this process stores is driven from the next pass on."""
    store = CountedStore(MemoryCollection())
    port = FakePort(floors={0: 0.5, 1: 0.5})
    driver = Driver(store=store, port=port, interval_s=0.01, idle_s=60)
    task = asyncio.create_task(driver.run_forever())
    try:
        await asyncio.sleep(0.3)
        assert store.reads == 1  # about 30 before
        await store.insert(search_doc())
        for _ in range(100):
            if port.submitted:
                break
            await asyncio.sleep(0.01)
        assert port.submitted and store.reads >= 2
    finally:
        task.cancel()


@pytest.mark.asyncio
async def test_a_search_stored_with_a_pattern_now_refused_goes_on_without_that_metric():
    """A search's template holding a metric pattern this version refuses (too complex: `shared.safe_regex`) was
    accepted when it came: the driver reads it back without that metric instead of failing every pass."""
    doc = search_doc()
    wide = {"name": "acc", "regex": "(?P<value>.{0,250})y", "mode": "min"}
    doc["spec"]["template"]["algorithm"]["metrics"] = [wide]
    store, _ = await started(doc)
    port = FakePort()
    await Driver(store=store, port=port).pass_once(now_ms=T0)
    assert port.submitted == ["s-unit-t0", "s-unit-t1"]


# Found by review (2026-11-29), each failing on the driver before.


async def test_a_stop_that_overtakes_a_pass_leaves_no_trial_job_running():
    """A pass submitted its trials and marked them submitted in memory only; a stop in between made its save a
    conflict, the marks were lost, and the next pass ended the search Stopped without terminating those jobs."""
    store, _ = await started(search_doc(max_trials=6, parallelism=2))
    port = FakePort()
    submit = port.submit

    async def submit_then_stop(search, **kw):
        await submit(search, **kw)
        if kw["trial"] == 1:
            await store.request_stop("p", "s-unit", by="bob")  # the user's stop lands during the pass

    port.submit = submit_then_stop
    driver = Driver(store=store, port=port)
    for _ in range(4):
        await driver.pass_once(now_ms=T0)
    doc = await store.get("p", "s-unit")
    assert doc["phase"] == "Stopped"
    assert sorted(j for j, _ in port.terminated) == sorted(port.jobs)  # every trial job told to end


async def test_trial_jobs_deleted_after_they_were_seen_still_count_against_the_budget():
    """Spend was summed over the trial jobs that still existed: deleting finished ones refunded the budget (8
    one-GPU-hour trials on 1.5). What each ran is kept on the trial once seen; a trial job of a running search
    cannot be deleted (the API refuses: `test_search_api`)."""
    store, _ = await started(search_doc(max_trials=10, parallelism=1, max_gpu_hours=1.5))
    port = FakePort()
    driver = Driver(store=store, port=port)
    for _ in range(8):
        await driver.pass_once(now_ms=T0 + 3_700_000)  # submits the next trial
        await driver.pass_once(now_ms=T0 + 3_700_000)  # sees it running, an hour in
        port.advance(20)
        for job_id, job in list(port.jobs.items()):
            if job["status"]["phase"] == "Completed":
                del port.jobs[job_id]  # its owner deletes each finished trial job
    assert len(port.submitted) == 2  # 1 GPU-hour each: the second passes 1.5


async def test_a_stopped_search_keeps_its_best_trial():
    store, _ = await started(search_doc(max_trials=4, parallelism=2))
    port = FakePort(floors={0: 0.1, 1: 0.5})
    driver = Driver(store=store, port=port)
    await driver.pass_once(now_ms=T0)
    port.advance(5)
    await driver.pass_once(now_ms=T0)
    before = (await store.get("p", "s-unit"))["best"]
    assert before is not None
    await store.request_stop("p", "s-unit", by="ana")
    await driver.pass_once(now_ms=T0)
    await driver.pass_once(now_ms=T0)
    doc = await store.get("p", "s-unit")
    assert doc["phase"] == "Stopped" and doc["best"] == before
