"""One submission, whatever the dialect, asks placement for candidates once and billing once, at placement's price."""

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.fernet import Fernet
from nats.errors import NoRespondersError

from shared import asking
from shared.bus import RPC_ADMIT, RPC_CANDIDATES
from shared.rpc import Candidate, CandidatesReply
from services.submitter import rpc
from services.submitter.admission import price
from services.submitter.dialects import JobCreate
from services.submitter.refusals import NameTaken
from services.submitter.sealing import Sealer
from services.submitter.searches.trials import SubmitterPort
from services.submitter.views import SECRET_VALUES
from tests.factories import job_body
from tests.memory import MemoryCollection
from tests.unit.api_app import client, make_app

PROJECT = "vision"
OFFER = Candidate(
    node_kind="local",
    node_id="n1",
    price_per_hour=3.0,
    predicted_duration_s=7200,
    duration_source="estimator",
    expected_cost=6.0,
    free_now=True,
)


@dataclass
class CountingBroker:
    """Answers placement's candidates and billing's admission, and keeps every question asked."""

    admit: dict[str, Any] = field(default_factory=lambda: {"allowed": True, "limited": True})
    placement_away: bool = False
    billing_away_for: int = 0  # how many admission questions find nobody listening (a leader changing)
    asked: list[tuple[str, Any]] = field(default_factory=list)

    async def request(self, payload, subject: str, timeout: float = 0):
        self.asked.append((subject, payload))
        if subject == RPC_CANDIDATES and self.placement_away:
            raise TimeoutError("placement is away")
        if subject == RPC_ADMIT and sum(s == RPC_ADMIT for s, _ in self.asked) <= self.billing_away_for:
            raise NoRespondersError
        answer = {RPC_CANDIDATES: CandidatesReply(candidates=[OFFER]).model_dump(mode="json"), RPC_ADMIT: self.admit}[
            subject
        ]
        return SimpleNamespace(decode=lambda: _async(answer))

    def subjects(self) -> list[str]:
        return [subject for subject, _ in self.asked]


async def _async(value):
    return value


@dataclass
class MemoryRepo:
    """The few repository calls a submission makes."""

    jobs: MemoryCollection = field(default_factory=MemoryCollection)
    added: Counter = field(default_factory=Counter)  # places in the queue given, by project and by user

    async def insert_many(self, new: list[tuple[dict, Any]]) -> list[list[dict] | NameTaken]:
        stored: list[list[dict] | NameTaken] = []
        for doc, event in new:
            if await self.jobs.find_one({"project_id": doc["project_id"], "name": doc["name"]}):
                stored.append(NameTaken(doc["name"], project_id=doc["project_id"]))
            else:
                await self.jobs.insert_one(doc)
                self.added.update([doc["project_id"], "user:" + doc["user_name"]])
                stored.append([{"event_id": event.event_id}])
        return stored

    async def publish_many(self, items: list) -> list[None]:
        return [None] * len(items)

    async def exists(self, job_id: str) -> bool:
        return await self.jobs.find_one({"_id": job_id}) is not None

    async def queued_count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        return await self.jobs.count_documents({"project_id": project_id} if project_id else {"user_name": user_name})

    def queued_added(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        return self.added[project_id or f"user:{user_name}"]


async def api(**broker: Any):
    app, _, _ = await make_app(broker=CountingBroker(**broker), repo=MemoryRepo())
    return app


def bus(app) -> CountingBroker:
    return app.state.submitter.requester.broker


def jobs(app) -> MemoryCollection:
    return app.state.submitter.repo.jobs


def admitted_at(app) -> Any:
    [query] = [payload for subject, payload in bus(app).asked if subject == RPC_ADMIT]
    return query


@pytest.mark.asyncio
async def test_a_v2_submission_asks_placement_once_and_billing_once_at_placements_price():
    app = await api()
    async with client(app) as http:
        created = await http.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="one", gpu_count=2))
    assert created.status_code == 201, created.text
    assert sorted(bus(app).subjects()) == [RPC_ADMIT, RPC_CANDIDATES]
    query = admitted_at(app)
    assert (query.estimated_cost, query.estimated_gpu_hours, query.gpus) == (6.0, 4.0, 2)


@pytest.mark.asyncio
async def test_placement_is_asked_with_the_parameters_the_estimator_needs_and_billing_charges_its_quote():
    app = await api()
    bert = [{"name": "benchmark", "value": "bert"}, {"name": "batch_size", "value": "64"}]
    async with client(app) as http:
        created = await http.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="bert", parameters=bert))
    assert created.status_code == 201, created.text
    [query] = [payload for subject, payload in bus(app).asked if subject == RPC_CANDIDATES]
    assert [(p.name, p.value) for p in query.parameters] == [("benchmark", "bert"), ("batch_size", "64")]
    assert admitted_at(app).estimated_cost == OFFER.expected_cost


@pytest.mark.asyncio
async def test_a_v1_submission_takes_the_same_path():
    app = await api()
    async with client(app) as http:
        created = await http.post(
            f"/v1/{PROJECT}/training-jobs",
            json={"job_name": "v1-one", "config": {"worker_server_num": 1, "user_command": "true"}},
        )
    assert created.status_code == 200, created.text
    assert sorted(bus(app).subjects()) == [RPC_ADMIT, RPC_CANDIDATES]
    assert admitted_at(app).estimated_cost == 6.0


@pytest.mark.asyncio
async def test_a_search_trial_takes_the_same_path():
    app = await api()
    search = {
        "_id": "s-1",
        "name": "sweep",
        "project_id": PROJECT,
        "user_name": "ana",
        "spec": {"template": job_body(name="t")},
    }
    await SubmitterPort(app.state.submitter).submit(search, trial=0, job_id="s-1-0", parameters={"lr": 0.1})
    assert (await jobs(app).find_one({"_id": "s-1-0"}))["search_id"] == "s-1"
    assert sorted(bus(app).subjects()) == [RPC_ADMIT, RPC_CANDIDATES]


@pytest.mark.asyncio
async def test_a_search_trials_job_is_sealed_its_searchs_secrets_and_refused_where_they_are_gone_or_unreadable():
    from services.submitter.searches.driver import Submitted

    app = await api()
    sealer = app.state.submitter.sealer
    template = job_body(name="t")
    template["algorithm"]["secret_names"] = ["HF_TOKEN"]
    search = {"_id": "s-3", "name": "keyed", "project_id": PROJECT, "user_name": "ana", "spec": {"template": template}}
    port = SubmitterPort(app.state.submitter)
    await port.submit(
        {**search, SECRET_VALUES: sealer.seal("s-3", {"HF_TOKEN": "hf_abc123"})}, trial=0, job_id="s-3-0", parameters={}
    )
    stored = await jobs(app).find_one({"_id": "s-3-0"})
    assert stored["algorithm"]["secret_names"] == ["HF_TOKEN"] and "hf_abc123" not in str(stored)
    assert sealer.open("s-3-0", stored[SECRET_VALUES]) == {"HF_TOKEN": "hf_abc123"}  # sealed for the trial's job
    other_key = Sealer([Fernet.generate_key()]).seal("s-3", {"HF_TOKEN": "x"})  # another replica's key: asked again
    cases = ((other_key, True), (sealer.seal("s-other", {"HF_TOKEN": "x"}), False), ({}, False), (None, False))
    for kept, retry in cases:
        with pytest.raises(Submitted) as refused:  # another key; another search's value; its end removed them; never
            await port.submit({**search, SECRET_VALUES: kept}, trial=1, job_id="s-3-1", parameters={})
        assert refused.value.retry is retry and "secrets" in refused.value.reason
    assert await jobs(app).find_one({"_id": "s-3-1"}) is None


@pytest.mark.asyncio
async def test_without_placement_the_job_is_priced_at_the_default_and_taken():
    app = await api(placement_away=True)
    async with client(app) as http:
        created = await http.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="away", gpu_count=1))
    assert created.status_code == 201, created.text
    assert sorted(bus(app).subjects()) == [RPC_ADMIT, RPC_CANDIDATES]
    assert admitted_at(app).estimated_cost == 4.0  # DEFAULT_PRICE_PER_HOUR for one hour


@pytest.mark.asyncio
async def test_a_refused_admission_stores_nothing():
    app = await api(
        admit={"allowed": False, "limited": True, "reason": "budget", "error_code": "406029", "http_status": 403}
    )
    async with client(app) as http:
        refused = await http.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="costly"))
    assert refused.status_code == 403 and refused.json()["error_code"] == "406029"
    assert sorted(bus(app).subjects()) == [RPC_ADMIT, RPC_CANDIDATES]
    assert await jobs(app).find_one({"name": "costly"}) is None


def test_a_job_is_priced_at_the_placement_the_policy_would_decide_not_at_the_cheapest_shown():
    decided = OFFER.model_copy(update={"expected_cost": 6.0, "predicted_duration_s": 3600})
    cheaper = OFFER.model_copy(update={"node_id": "n2", "expected_cost": 1.0, "predicted_duration_s": 7200})
    body = JobCreate.model_validate(job_body(name="priced"))
    dollars, gpu_hours = price(body, CandidatesReply(candidates=[decided, cheaper]))
    assert dollars == 6.0 and gpu_hours == body.spec.resource.gpu_count * body.spec.resource.node_count * 1.0


@pytest.mark.asyncio
async def test_a_submission_waits_out_a_short_hand_over_of_billing(monkeypatch):
    monkeypatch.setattr(asking, "LONGEST_PAUSE_S", 0.01)
    app = await api(billing_away_for=3)
    async with client(app) as http:
        created = await http.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="during", gpu_count=1))
    assert created.status_code == 201, created.text
    assert bus(app).subjects().count(RPC_ADMIT) == 4


@pytest.mark.asyncio
async def test_a_service_away_longer_than_the_timeout_is_a_503_with_retry_after(monkeypatch):
    monkeypatch.setattr(asking, "LONGEST_PAUSE_S", 0.01)
    monkeypatch.setattr(rpc, "TIMEOUT_S", 0.1)
    app = await api(billing_away_for=10_000)
    async with client(app) as http:
        refused = await http.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="away", gpu_count=1))
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error_code"] == "406003" and "billing service did not answer" in refused.json()["error_msg"]
    assert await jobs(app).find_one({"name": "away"}) is None


@pytest.mark.asyncio
async def test_a_trial_whose_job_no_service_would_read_fails_at_once_and_nothing_is_stored():
    """A search stored before a template's parameters and its space were held to 100 together: its trial's job
    (101 parameters) was stored and announced, dropped by every reader, and stayed Creating for ever."""
    from services.submitter.searches.driver import Submitted

    app = await api()
    template = job_body(name="t")
    template["algorithm"]["parameters"] = [{"name": f"p{i}", "value": "1"} for i in range(100)]
    search = {"_id": "s-2", "name": "wide", "project_id": PROJECT, "user_name": "ana", "spec": {"template": template}}
    with pytest.raises(Submitted) as refused:
        await SubmitterPort(app.state.submitter).submit(search, trial=0, job_id="s-2-0", parameters={"lr": 0.1})
    assert not refused.value.retry and "406001" in refused.value.reason
    assert await jobs(app).find_one({"_id": "s-2-0"}) is None and bus(app).asked == []
