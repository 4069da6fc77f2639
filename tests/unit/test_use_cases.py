"""The submitter's use cases called as a trial, a CLI or a test would: plain values in, a job view or a domain
refusal out, no request and no HTTP; and each refusal answered by the API exactly as before (status, error code,
message, headers), from the one table in `errors`."""

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pymongo.errors import DuplicateKeyError

from shared.bus import RPC_ADMIT, RPC_CANDIDATES, RPC_TERMINATE
from shared.events import JobStatusChanged
from shared.jobs import JobCreate, Phase, SecondaryPhase
from shared.rpc import CandidatesReply
from shared.storage import StoragePolicy
from services.submitter import errors, refusals
from services.submitter.app import SubmitterSettings, build_submitter
from services.submitter.refusals import (
    Invalid,
    NameTaken,
    NotAdmitted,
    NotFinished,
    NotFound,
    QueueFull,
    ServiceAway,
    WrongPhase,
)
from services.submitter.repository import Repository
from services.submitter.usecases import SubmitJob, Submitter
from tests.factories import job_body
from tests.memory import MemoryCollection
from tests.unit.api_app import Db, add_user, client, make_app

PROJECT = "vision"


class UniqueNames(MemoryCollection):
    """api_jobs with its unique (project_id, name) index."""

    async def insert_one(self, doc: dict):
        if any(
            (d.get("project_id"), d.get("name")) == (doc.get("project_id"), doc.get("name")) for d in self.docs.values()
        ):
            raise DuplicateKeyError(f"duplicate name {doc.get('name')}")
        return await super().insert_one(doc)


@dataclass(eq=False)
class Bus:
    """Placement offers nothing, billing admits (or refuses), the monitor is away; publishes are kept."""

    admit: dict[str, Any] = field(default_factory=lambda: {"allowed": True})
    asked: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)  # subjects

    async def request(self, payload, subject: str, *, timeout: float = 0):
        self.asked.append(subject)
        answers = {RPC_CANDIDATES: CandidatesReply(candidates=[]).model_dump(mode="json"), RPC_ADMIT: self.admit}
        if subject not in answers:
            raise TimeoutError(subject)
        return SimpleNamespace(decode=lambda: _value(answers[subject]))

    async def publish(self, message, subject: str, **_: Any) -> None:
        self.published.append(subject)


async def _value(value):
    return value


def submitter(**bus: Any) -> Submitter:
    settings = SubmitterSettings(
        nats_url="nats://127.0.0.1:1", max_queued_per_user=2, secrets_keys=Fernet.generate_key().decode()
    )
    broker = Bus(**bus)
    db = Db(api_jobs=UniqueNames("api_jobs"))
    return build_submitter(
        settings,
        repo=Repository(db=db, broker=broker),
        broker=broker,
        storage=StoragePolicy(storage_root="s3://tm/storage", checkpoint_root="s3://tm/ckpt"),
    )


def command(name: str, **kw: Any) -> SubmitJob:
    return SubmitJob(project_id=PROJECT, user_name="ana", body=JobCreate.model_validate(job_body(name=name)), **kw)


async def finish(use: Submitter, job_id: str) -> None:
    await use.repo.apply_status(
        JobStatusChanged(
            event_id=f"{job_id}:status:9",
            job_id=job_id,
            project_id=PROJECT,
            user_name="ana",
            version=9,
            phase=Phase.COMPLETED,
            secondary_phase=SecondaryPhase.COMPLETED,
        )
    )


async def test_a_job_is_submitted_with_plain_values_and_announced():
    use = submitter()
    job = await use.submit(command("one", job_id="t-1", links={"search_id": "s-1"}))
    assert (job.metadata.id, job.metadata.name, job.status.phase) == ("t-1", "one", Phase.CREATING)
    assert (await use.repo.job("t-1"))["search_id"] == "s-1"
    assert use.requester.broker.published == ["tm.job.submitted"]


async def test_a_taken_name_is_refused_in_domain_terms_by_submit_and_dry_run():
    use = submitter()
    await use.submit(command("same"))
    with pytest.raises(NameTaken) as taken:
        await use.submit(command("same"))
    assert (taken.value.name, taken.value.project_id) == ("same", PROJECT)
    with pytest.raises(NameTaken):
        await use.dry_run(project_id=PROJECT, user_name="ana", body=command("same").body)


async def test_the_caps_billing_and_storage_refuse_before_anything_is_stored():
    use = submitter()
    await use.submit(command("a"))
    await use.submit(command("b"))
    with pytest.raises(QueueFull):
        await use.submit(command("c"))  # the user's cap of 2
    refusing = submitter(admit={"allowed": False, "reason": "budget", "error_code": "406029", "http_status": 403})
    with pytest.raises(NotAdmitted) as refused:
        await refusing.submit(command("costly"))
    assert refused.value.retry and refused.value.code == "406029"
    outside = command("outside").body.model_copy(
        update={"algorithm": command("x").body.algorithm.model_copy(update={"code_dir": "/etc"})}
    )
    with pytest.raises(Invalid) as invalid:
        await use.submit(SubmitJob(project_id=PROJECT, user_name="bob", body=outside))
    assert invalid.value.field == "algorithm.code_dir" and not await use.repo.name_taken(PROJECT, "outside")


async def test_act_and_delete_refuse_by_phase_and_for_a_missing_job():
    use = submitter()
    job_id = (await use.submit(command("run"))).metadata.id
    with pytest.raises(WrongPhase):
        await use.act(project_id=PROJECT, job_id=job_id, action="migrate", requested_by="ana")  # not Running
    with pytest.raises(NotFinished):
        await use.delete(project_id=PROJECT, job_id=job_id)
    with pytest.raises(NotFound):
        await use.delete(project_id="other", job_id=job_id)  # another project's job does not exist there
    terminated = await use.act(project_id=PROJECT, job_id=job_id, action="terminate", requested_by="ana")
    assert terminated.metadata.id == job_id and RPC_TERMINATE in use.requester.broker.asked
    assert use.requester.broker.published[-1] == "tm.job.terminate"  # the monitor away: left on the stream
    await finish(use, job_id)
    await use.delete(project_id=PROJECT, job_id=job_id)
    assert not await use.repo.exists(job_id)


ANSWERS = [  # the status, body and headers each refusal was answered with before use cases raised them
    (
        Invalid("spec.resource.pool_id", "no pool 'x' (GET /v2/pools lists them)"),
        400,
        {
            "error_code": "406001",
            "error_msg": "param[spec.resource.pool_id] invalid: no pool 'x' (GET /v2/pools lists them)",
        },
        None,
    ),
    (
        NameTaken("one", project_id="vision"),
        409,
        {"error_code": "406026", "error_msg": "job name one already exists in project vision"},
        None,
    ),
    (
        NameTaken("sweep", project_id="vision", what="search"),
        409,
        {"error_code": "406026", "error_msg": "search name sweep already exists in project vision"},
        None,
    ),
    (NotFound("j-1"), 404, {"error_code": "406012", "error_msg": "job j-1 does not exist"}, None),
    (NotFound("s-1", what="search"), 404, {"error_code": "406012", "error_msg": "search s-1 does not exist"}, None),
    (
        WrongPhase("j-1", phase="Pending", done="migrated", hint=" (only Running jobs move)"),
        409,
        {"error_code": "406027", "error_msg": "job j-1 is Pending and cannot be migrated (only Running jobs move)"},
        None,
    ),
    (
        WrongPhase("s-1", phase="Completed", done="stopped", what="search"),
        409,
        {"error_code": "406027", "error_msg": "search s-1 is Completed and cannot be stopped"},
        None,
    ),
    (
        NotFinished("j-1", phase="Running"),
        409,
        {
            "error_code": "406014",
            "error_msg": "job j-1 is Running: only Completed, Failed or Terminated jobs can be "
            "deleted; terminate it first",
        },
        None,
    ),
    (
        QueueFull(scope="user", name="ana", queued=500, cap=500),
        429,
        {
            "error_code": "406035",
            "error_msg": "the queued job quantity of user ana has reached the upper limit (500 of "
            "500 not yet running); wait for some to start or terminate them",
        },
        {"retry-after": "10"},
    ),
    (
        NotAdmitted("[vision.budget] quota exceeded: no", code="406029", status=403),
        403,
        {"error_code": "406029", "error_msg": "[vision.budget] quota exceeded: no"},
        None,
    ),
    (NotAdmitted("no", code="", status=403), 403, {"error_code": "406008", "error_msg": "no"}, None),
    (
        ServiceAway("billing", TimeoutError()),
        503,
        {"error_code": "406003", "error_msg": "billing service did not answer: TimeoutError()"},
        {"retry-after": "1"},
    ),
]


@pytest.mark.parametrize("refusal, status, body, headers", ANSWERS)
def test_each_refusal_is_answered_as_the_api_always_did(refusal, status, body, headers):
    response = errors.answer(*errors.described(refusal))
    assert response.status_code == status and json.loads(response.body) == body
    assert response.body == json.dumps(body, separators=(",", ":")).encode()
    assert {k: v for k, v in response.headers.items() if k == "retry-after"} == (headers or {})


def test_every_refusal_has_its_answer():
    kinds = [k for k in vars(refusals).values() if isinstance(k, type) and issubclass(k, refusals.Refused)]
    assert {k for k in kinds if k is not refusals.Refused} <= set(errors.ANSWERS)


async def test_the_routes_answer_the_use_cases_refusals_as_before():
    app, _, tokens = await make_app(broker=Bus())
    outsider = await add_user(tokens, "bob", ["other"])
    async with client(app) as admin, client(app, outsider) as bob:
        job_id = (await admin.post(f"/v2/{PROJECT}/training-jobs", json=job_body(name="r"))).json()["metadata"]["id"]
        jobs = f"/v2/{PROJECT}/training-jobs/{job_id}"
        moved = await admin.post(f"{jobs}/actions", json={"action_type": "migrate"})
        assert (moved.status_code, moved.json()) == (
            409,
            {
                "error_code": "406027",
                "error_msg": (f"job {job_id} is Creating and cannot be migrated (only Running jobs move)"),
            },
        )
        deleted = await admin.delete(jobs)
        assert (deleted.status_code, deleted.json()["error_code"]) == (409, "406014")
        for hidden in (
            await bob.get(jobs),
            await bob.delete(jobs),
            await bob.post(f"{jobs}/actions", json={"action_type": "terminate"}),
        ):
            assert (hidden.status_code, hidden.json()) == (
                404,
                {"error_code": "406012", "error_msg": f"job {job_id} does not exist"},
            )
        taken = await admin.post(f"/v2/{PROJECT}/training-jobs?dry_run=true", json=job_body(name="r"))
        assert (taken.status_code, taken.json()["error_code"]) == (409, "406026")
        assert (await admin.post(f"{jobs}/actions", json={"action_type": "terminate"})).status_code == 202
        await finish(app.state.submitter, job_id)
        assert (await admin.delete(jobs)).status_code == 204
        assert (await admin.get(jobs)).status_code == 404
