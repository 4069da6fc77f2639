"""A job's secrets reach its task's environment and nothing else: not the stored job, not an event, not a view,
not a node the attempt was not placed on, not the task's shipped output."""

from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet
from pydantic import ValidationError

from shared.events import LogLine, StartTask
from shared.jobs import Algorithm, JobCreate, Phase, SecondaryPhase
from shared.jobsecrets import SecretsAnswer, SecretsQuery
from shared.lru import Lru
from shared.origin import Origins
from services.agent import jobsecrets as agent_secrets
from services.agent.jobsecrets import Masker
from services.agent.preparation import PrepareError
from services.agent.rekey import Keying
from services.agent.shipping import LogShipper
from services.cli.client import CliError
from services.cli.jobfile import secrets_from
from services.submitter import secrets as submitter_secrets
from services.submitter.sealing import Sealer
from services.submitter.views import SECRET_VALUES, carried, new_job, render, status_fields
from tests.factories import T0, job_body, spec, start_task, status_changed, submitted
from tests.unit.api_app import client, make_app

SECRET = "s3cr3t-wandb-key-0123456789"
SEALER = Sealer([Fernet.generate_key()])


def body_with(secrets: dict[str, str], **algorithm) -> dict:
    body = job_body(command="python3 train.py")
    body["algorithm"].update(secrets=secrets, **algorithm)
    return body


def test_a_secret_is_named_as_an_environment_variable_and_never_echoed():
    with pytest.raises(ValidationError, match="secret name 'not-a-name' is not valid"):
        JobCreate.model_validate(body_with({"not-a-name": "x"}))
    with pytest.raises(ValidationError, match="secret 'TRAINMASTER_JOB_ID' is set by trainmaster"):
        JobCreate.model_validate(body_with({"TRAINMASTER_JOB_ID": "x"}))
    with pytest.raises(ValidationError) as long:
        JobCreate.model_validate(body_with({"TOKEN": SECRET * 400}))
    assert "secret 'TOKEN' is longer than 8192 characters" in str(long.value) and SECRET not in str(long.value)
    with pytest.raises(ValidationError, match="'TOKEN' is both a secret and a parameter or environment variable"):
        JobCreate.model_validate(body_with({"TOKEN": SECRET}, environments={"TOKEN": "visible"}))


def test_an_environment_is_held_to_the_same_names_as_secrets_but_may_set_what_the_agent_sets_beneath_it():
    with pytest.raises(ValidationError, match="environment variable name 'bad-name' is not valid"):
        Algorithm(command="true", environments={"bad-name": "v"})
    with pytest.raises(ValidationError, match="environment variable 'RANK' is set by trainmaster"):
        Algorithm(command="true", environments={"RANK": "3"})
    with pytest.raises(ValidationError, match="environment variable 'X' is longer than 8192 characters"):
        Algorithm(command="true", environments={"X": "v" * 8193})
    assert Algorithm(command="true", environments={"PATH": "/opt/bin"}).environments == {"PATH": "/opt/bin"}


def test_a_secret_may_not_name_what_the_agent_sets_and_keeps_its_whitespace():
    for name in ("PATH", "VIRTUAL_ENV", "HOME", "PYTHONPATH", "TMPDIR"):
        with pytest.raises(ValidationError, match=f"secret '{name}' is set by trainmaster"):
            JobCreate.model_validate(body_with({name: "x"}))
        with pytest.raises(ValidationError, match=f"secret '{name}' is set by trainmaster"):
            Algorithm(command="true", secret_names=[name])  # nor as a name an event carries
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n"
    body = JobCreate.model_validate(body_with({"SSH_KEY": pem, "PASSWORD": " with spaces "}))
    assert body.algorithm.secrets == {"SSH_KEY": pem, "PASSWORD": " with spaces "}


def test_a_job_without_secrets_serialises_as_before_them():
    """A reader of the version before secrets (its Algorithm refuses unknown fields) still reads every job that has
    none: neither field is written when empty."""
    text = Algorithm(command="true").model_dump_json()
    assert "secret" not in text
    assert "secret_names" in Algorithm(command="true", secret_names=["TOKEN"]).model_dump_json()


async def test_the_apis_refusal_names_the_secret_and_never_shows_its_value():
    app, _, _ = await make_app()
    async with client(app) as api:
        for secrets in ({"bad-name": SECRET}, {"TOKEN": SECRET * 400}, {"TOKEN": 5}):
            answer = await api.post("/v2/p1/training-jobs", json=body_with(secrets))
            assert answer.status_code == 400 and "algorithm.secrets" in answer.text, answer.text
            assert SECRET not in answer.text


def test_the_stored_job_carries_the_secrets_names_and_the_sealed_values_and_the_view_shows_no_value():
    body = JobCreate.model_validate(body_with({"WANDB_API_KEY": SECRET, "HF_TOKEN": "hf_abcdef"}))
    sealed = SEALER.seal("j1", body.algorithm.secrets)
    doc = new_job(job_id="j1", project_id="p", user_name="ana", body=body, now=T0, sealed=sealed)
    assert "secrets" not in doc["algorithm"] and doc["algorithm"]["secret_names"] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert doc[SECRET_VALUES] == sealed and SECRET not in repr(doc)
    assert SECRET not in render(doc, now=T0).model_dump_json()
    assert carried(body.algorithm).secret_names == ["HF_TOKEN", "WANDB_API_KEY"] and not carried(body.algorithm).secrets
    assert SECRET_VALUES not in new_job(
        job_id="j2", project_id="p", user_name="ana", body=JobCreate.model_validate(body_with({})), now=T0
    )


def test_no_event_carries_a_secrets_value():
    valued = Algorithm(command="true", secrets={"TOKEN": SECRET}).model_dump()
    for event in (submitted(job_id="j"), start_task("j")):
        with pytest.raises(ValidationError, match="secret values never travel in an event"):
            type(event).model_validate({**event.model_dump(), "algorithm": valued})
    named = {**start_task("j").model_dump(), "algorithm": {"command": "true", "secret_names": ["TOKEN"]}}
    assert StartTask.model_validate(named).algorithm.secret_names == ["TOKEN"]


def test_a_jobs_end_removes_its_secrets_and_no_earlier_status_does():
    for phase, secondary in ((Phase.COMPLETED, SecondaryPhase.COMPLETED), (Phase.FAILED, SecondaryPhase.FAILED)):
        assert status_fields(status_changed("j", phase, secondary, version=3))[SECRET_VALUES] == {}
    running = status_changed("j", Phase.RUNNING, SecondaryPhase.RUNNING, version=2)
    assert SECRET_VALUES not in status_fields(running)


class Placements:
    """What `shared.origin.Origins` answers for the submitter's check."""

    def __init__(self, placed: dict[tuple[str, int], dict[str, str]], *, all_read: bool = True) -> None:
        self.placed, self.read = placed, all_read
        self.unplaced: Lru[str, float] = Lru(16)
        self.clock = lambda: 0.0

    async def later_placed(self, job_id: str, attempt: int) -> bool:
        return any(j == job_id and a > attempt for (j, a) in self.placed)

    async def nodes(self, job_id: str, attempt: int) -> dict[str, str] | None:
        return self.placed.get((job_id, attempt))

    async def all_read(self) -> bool:
        return self.read


def repo(placed, docs, *, all_read: bool = True) -> SimpleNamespace:
    async def secrets_of(job_id: str) -> tuple[str, int, str] | None:
        doc = docs.get(job_id)
        status = doc["status"] if doc else {}
        sealed = doc.get(SECRET_VALUES) if doc else None
        return (
            None
            if doc is None
            else (status["phase"], status.get("attempt", 1), sealed if isinstance(sealed, str) else "")
        )

    return SimpleNamespace(origins=Placements(placed, all_read=all_read), secrets_of=secrets_of)


RUNNING = {"status": {"phase": "Running"}, SECRET_VALUES: SEALER.seal("j", {"TOKEN": SECRET})}


@pytest.mark.parametrize(
    ("query", "node", "placed", "doc", "error", "final"),
    [
        ((1, 0), "n1", {("j", 1): {"0": "n1"}}, RUNNING, "", False),
        ((1, 0), "n2", {("j", 1): {"0": "n1"}}, RUNNING, "that rank was not placed on this node", True),
        ((1, 1), "n1", {("j", 1): {"0": "n1"}}, RUNNING, "that rank was not placed on this node", True),
        ((1, 0), "n1", {("j", 1): {"0": "n1"}, ("j", 2): {"0": "n2"}}, RUNNING, "a later attempt", True),
        ((3, 0), "n1", {("j", 1): {"0": "n1"}}, RUNNING, "never placed", True),
        ((1, 0), "n1", {("j", 1): {"0": "n1"}}, None, "no such job", True),
        ((1, 0), "n1", {("j", 1): {"0": "n1"}}, {"status": {"phase": "Completed"}}, "the job has ended", True),
    ],
)
async def test_the_submitter_gives_a_jobs_secrets_only_to_the_node_its_newest_attempts_rank_was_placed_on(
    query, node, placed, doc, error, final
):
    attempt, rank = query
    answer = await submitter_secrets.answer(
        repo(placed, {"j": doc} if doc else {}),
        SecretsQuery(job_id="j", attempt=attempt, rank=rank),
        node_id=node,
        sealer=SEALER,
    )
    assert error in answer.error and answer.final == final and bool(answer.error) == bool(error)
    assert (answer.values == {"TOKEN": SECRET}) == (not error)


async def test_a_sealed_secret_is_opened_for_its_node_and_one_sealed_with_another_key_is_refused():
    placed = {("j", 1): {"0": "n1"}}
    doc = {"status": {"phase": "Running"}, SECRET_VALUES: SEALER.seal("j", {"TOKEN": SECRET})}
    query = SecretsQuery(job_id="j", attempt=1)
    answer = await submitter_secrets.answer(repo(placed, {"j": doc}), query, node_id="n1", sealer=SEALER)
    assert answer.values == {"TOKEN": SECRET} and not answer.error
    other = Sealer([Fernet.generate_key()])  # another replica may hold the key: asked again, not failed
    answer = await submitter_secrets.answer(repo(placed, {"j": doc}), query, node_id="n1", sealer=other)
    assert not answer.final and "sealed with a key this submitter does not hold" in answer.error
    assert not answer.values
    copied = {("k", 1): {"0": "n1"}}  # j's sealed secrets written onto job k by someone without the key
    answer = await submitter_secrets.answer(
        repo(copied, {"k": doc}), SecretsQuery(job_id="k", attempt=1), node_id="n1", sealer=SEALER
    )
    assert "sealed for another job" in answer.error and not answer.values


async def test_a_found_placement_is_served_while_others_are_read_and_the_jobs_own_attempt_counts():
    """Holding every start while placements are being read would hold them as long as jobs keep being placed."""
    placed = {("j", 1): {"0": "n1"}}
    answer = await submitter_secrets.answer(
        repo(placed, {"j": RUNNING}, all_read=False), SecretsQuery(job_id="j", attempt=1), node_id="n1", sealer=SEALER
    )
    assert answer.values == {"TOKEN": SECRET} and not answer.error
    moved = {"status": {"phase": "Pending", "attempt": 2}, SECRET_VALUES: SEALER.seal("j", {"TOKEN": SECRET})}
    answer = await submitter_secrets.answer(
        repo(placed, {"j": moved}), SecretsQuery(job_id="j", attempt=1), node_id="n1", sealer=SEALER
    )
    assert answer.final and answer.error == "a later attempt of the job was placed" and not answer.values


async def test_a_placement_not_read_yet_is_a_passing_refusal():
    answer = await submitter_secrets.answer(
        repo({}, {"j": RUNNING}, all_read=False), SecretsQuery(job_id="j", attempt=1), node_id="n1", sealer=SEALER
    )
    assert answer.error == "its placement is not read yet" and not answer.final and not answer.values


def start(names: list[str]) -> StartTask:
    return StartTask(
        event_id="e",
        node_id="n1",
        job_id="j",
        attempt=2,
        rank=1,
        project_id="p",
        user_name="u",
        algorithm=Algorithm(command="true", secret_names=names),
        spec=spec(),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_agent_asks_again_while_the_refusal_passes_and_stops_at_a_final_one(monkeypatch):
    answers = [
        TimeoutError(),
        SecretsAnswer(error="its placement is not read yet"),
        SecretsAnswer(values={"TOKEN": SECRET, "OTHER": "not asked"}),
    ]
    asked: list[tuple[SecretsQuery, str]] = []

    async def ask(client, query, *, node_id):
        asked.append((query, node_id))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(agent_secrets, "ask", ask)
    monkeypatch.setattr(agent_secrets, "PAUSE_S", 0)
    assert await agent_secrets.fetch(lambda: None, start(["TOKEN"]), node_id="n1") == {"TOKEN": SECRET}
    assert asked == [(SecretsQuery(job_id="j", attempt=2, rank=1), "n1")] * 3
    assert await agent_secrets.fetch(lambda: None, start([]), node_id="n1") == {}  # nothing asked
    assert len(asked) == 3

    answers[:] = [SecretsAnswer(error="that rank was not placed on this node", final=True)]
    with pytest.raises(PrepareError, match="secrets: the submitter refused them: that rank was not placed"):
        await agent_secrets.fetch(lambda: None, start(["TOKEN"]), node_id="n1")
    answers[:] = [SecretsAnswer(values={})]
    with pytest.raises(PrepareError, match="secrets: 'TOKEN' was not given"):
        await agent_secrets.fetch(lambda: None, start(["TOKEN"]), node_id="n1")


async def test_a_rented_nodes_agent_asks_only_once_it_holds_its_own_key(monkeypatch):
    keying = Keying()
    asked: list[SecretsQuery] = []
    checks = {"n": 0}

    async def ask(client, query, *, node_id):
        asked.append(query)
        return SecretsAnswer(values={"TOKEN": SECRET})

    def check() -> str | None:
        checks["n"] += 1
        if checks["n"] == 3:
            keying.done = True  # the trade is done meanwhile
        return keying.check()

    monkeypatch.setattr(agent_secrets, "ask", ask)
    monkeypatch.setattr(agent_secrets, "PAUSE_S", 0)
    assert await agent_secrets.fetch(lambda: None, start(["TOKEN"]), node_id="n1", keyed=check) == {"TOKEN": SECRET}
    assert len(asked) == 1 and checks["n"] == 3  # not asked while only the start identity was held

    refused = Keying()
    refused.refused = "a key for another node"
    with pytest.raises(PrepareError, match="holds only the identity it was started with.*a key for another node"):
        await agent_secrets.fetch(lambda: None, start(["TOKEN"]), node_id="n1", keyed=refused.check)
    assert len(asked) == 1


async def test_the_agent_gives_up_after_its_wait_and_says_why(monkeypatch):
    clock = Clock()

    async def ask(client, query, *, node_id):
        clock.now += 100
        raise TimeoutError()

    monkeypatch.setattr(agent_secrets, "ask", ask)
    monkeypatch.setattr(agent_secrets, "PAUSE_S", 0)
    with pytest.raises(
        PrepareError, match=r"secrets: not given in 300 s: no answer from the submitter \(TimeoutError\)"
    ):
        await agent_secrets.fetch(lambda: None, start(["TOKEN"]), node_id="n1", clock=clock, wait_s=300)
    assert clock.now == 300


def test_a_secret_is_masked_wherever_it_is_printed_and_a_short_one_is_not():
    mask = Masker([SECRET, "line-one\nline-two", "abc"])
    assert mask(f"key={SECRET}; again {SECRET}") == "key=***; again ***"
    assert mask("line-one then line-two") == "*** then ***"
    assert mask("abc is too short to mask") == "abc is too short to mask"
    assert not Masker(["abc"]) and Masker([SECRET])


async def test_the_shipper_masks_the_lines_it_ships_and_keeps(tmp_path):
    chunks = []

    async def publish(chunk) -> None:
        chunks.append(chunk)

    shipper = LogShipper(job_id="j", attempt=1, rank=0, node_id="n1", path=tmp_path / "output.log", publish=publish)
    shipper.mask = Masker([SECRET])
    shipper.add(LogLine(t=0.0, line=f"logged in with {SECRET}"))
    await shipper.close()
    assert [line.line for chunk in chunks for line in chunk.lines] == ["logged in with ***"]
    assert SECRET not in (tmp_path / "output.log").read_text()


def test_the_cli_takes_a_secrets_value_from_its_environment_never_from_its_command_line():
    assert secrets_from(["WANDB_API_KEY"], {"WANDB_API_KEY": SECRET}) == {"WANDB_API_KEY": SECRET}
    with pytest.raises(CliError, match="--secret HF_TOKEN: set HF_TOKEN in your environment first"):
        secrets_from(["HF_TOKEN"], {})


async def test_a_flood_of_made_up_attempts_is_looked_up_once_each_and_a_node_is_held_to_its_rate():
    looked: list[tuple[str, int]] = []
    placements = Placements({})

    async def nodes(job_id: str, attempt: int):
        looked.append((job_id, attempt))
        return None

    placements.nodes = nodes
    placements.unplaced = Lru(16)
    placements.clock = lambda: 100.0
    store = SimpleNamespace(origins=placements, secrets_of=None)
    for _ in range(3):
        answer = await submitter_secrets.answer(
            store, SecretsQuery(job_id="made-up", attempt=7), node_id="n1", sealer=SEALER
        )
        assert answer.final and answer.error == "that attempt was never placed"
    assert looked == [("made-up", 7)] * 2  # looked up, again once all were read, then from memory

    limiter = submitter_secrets.node_limiter()  # 40 at once, 20 a second, per node
    burst = int(submitter_secrets.BURST)
    assert [limiter.take("n1", 0.0) == 0 for _ in range(burst + 2)] == [True] * burst + [False, False]
    assert limiter.take("n2", 0.0) == 0  # another node's own allowance
    assert [limiter.take("n1", 0.1) == 0 for _ in range(3)] == [True, True, False]  # 0.1 s: two more


async def test_an_attempt_is_refused_once_a_later_one_was_placed_by_any_replica():
    """A replica that did not read the later placement finds its record (by id: attempts are numbered in turn)."""
    stored = {"j:2"}

    class Collection:
        async def find_one(self, query: dict, projection: dict) -> dict | None:
            return {"_id": query["_id"]} if query["_id"] in stored else None

    origins = Origins(placements=Collection(), all_read=lambda: None)
    origins.latest.put("j", 1)  # what this replica read
    assert await origins.later_placed("j", 1)
    assert not await origins.later_placed("j", 2)
    origins.latest.put("other", 3)
    assert await origins.later_placed("other", 2)  # what it read suffices
