"""POST/GET /v2/{project}/searches and the stop action on the real app (in-memory collections)."""

import pytest

from services.submitter.searches.store import SearchStore
from tests.unit.api_app import add_user, client, make_app


def body(**changes) -> dict:
    return {
        "name": "lr-sweep",
        "template": {
            "metadata": {"name": "t"},
            "algorithm": {
                "command": "python3 train.py",
                "metrics": [{"name": "loss", "regex": "loss (?P<value>[0-9.]+)"}],
            },
        },
        "space": {
            "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
            "width": {"type": "int", "low": 16, "high": 256},
            "opt": {"type": "categorical", "choices": ["sgd", "adam"]},
        },
        "objective": {"metric": "loss", "mode": "min"},
        "max_trials": 8,
        "parallelism": 4,
        "pruner": "predicted",
        **changes,
    }


async def app_and_client(token=None):
    app, db, tokens = await make_app()
    app.state.searches = SearchStore(db.api_searches)
    return app, db, tokens


@pytest.mark.asyncio
async def test_create_get_list_and_stop():
    app, db, _ = await app_and_client()
    async with client(app) as api:
        created = await api.post("/v2/vision/searches", json=body())
        assert created.status_code == 201, created.text
        search_id = created.json()["metadata"]["id"]
        shown = (await api.get(f"/v2/vision/searches/{search_id}")).json()
        assert shown["status"] == {
            "phase": "Running",
            "best": None,
            "reason": "",
            "gpu_hours": 0.0,
            "dollars": 0.0,
            "message": "",
        }
        assert shown["trials"] == [] and shown["spec"]["pruner"] == "predicted"
        listed = (await api.get("/v2/vision/searches")).json()
        assert listed["total"] == 1 and listed["items"][0]["metadata"]["id"] == search_id
        stop = await api.post(f"/v2/vision/searches/{search_id}/actions", json={"action_type": "stop"})
        assert stop.status_code == 202
        assert db.api_searches.docs[search_id]["stop_requested"] == "admin"
        again = await api.post("/v2/vision/searches/nope/actions", json={"action_type": "stop"})
        assert again.status_code == 404
        taken = await api.post("/v2/vision/searches", json=body())
        assert taken.status_code == 409


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "change, field",
    [
        ({"space": {"lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}}, "space.lr.low"),
        ({"space": {"lr": {"type": "float", "low": 0.5, "high": 0.1}}}, "space.lr.high"),
        ({"space": {"lr": {"type": "float", "low": "a", "high": 0.1}}}, "space.lr.low"),
        ({"space": {"lr": {"type": "float", "high": 0.1}}}, "space.lr.low"),
        ({"space": {"w": {"type": "int", "low": 1.5, "high": 4}}}, "space.w.low"),
        ({"space": {"w": {"type": "int", "low": 1, "high": 4, "choices": [1]}}}, "space.w.choices"),
        ({"space": {"o": {"type": "categorical", "choices": []}}}, "space.o.choices"),
        ({"space": {"o": {"type": "categorical", "choices": ["a"], "low": 1}}}, "space.o.low"),
        ({"space": {"o": {"type": "categorical"}}}, "space.o.choices"),
        ({"space": {"o": {"type": "tuple"}}}, "space.o.type"),
        ({"space": {"o": {"type": "float", "low": 1, "high": 2, "step": 1}}}, "space.o.step"),
        ({"space": {"bad name": {"type": "float", "low": 1, "high": 2}}}, "space.bad name.[key]"),
        ({"space": {}}, "space"),
        ({"max_trials": 0}, "max_trials"),
        ({"max_trials": 1001}, "max_trials"),
        ({"parallelism": 0}, "parallelism"),
        ({"pruner": "asha"}, "pruner"),
        ({"objective": {"metric": "loss", "mode": "up"}}, "objective.mode"),
        ({"objective": {"metric": "loss", "mode": "max"}}, "body"),
        ({"template": {"metadata": {"name": "t"}, "algorithm": {}}}, "template.algorithm"),
        ({"max_dollars": -1}, "max_dollars"),
        ({"max_gpu_hours": 0}, "max_gpu_hours"),
        ({"name": "bad name"}, "name"),
    ],
)
async def test_invalid_bodies_name_the_field(change, field):
    app, _, _ = await app_and_client()
    async with client(app) as api:
        answer = await api.post("/v2/vision/searches", json=body(**change))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_msg"].startswith(f"param[{field}]"), answer.json()
    assert answer.json()["error_code"] == "406001"


@pytest.mark.asyncio
async def test_searches_without_a_name_get_names_of_their_own_and_template_jobs_need_none():
    app, _, _ = await app_and_client()
    unnamed = {k: v for k, v in body().items() if k != "name"}
    unnamed["template"] = {k: v for k, v in unnamed["template"].items() if k != "metadata"}
    async with client(app) as api:
        names = []
        for _ in range(2):
            created = await api.post("/v2/vision/searches", json=unnamed)
            assert created.status_code == 201, created.text
            names.append(created.json()["metadata"]["name"])
    assert names[0].startswith("search-") and names[0] != names[1]


@pytest.mark.asyncio
async def test_a_space_name_that_is_also_a_fixed_parameter_is_refused():
    app, _, _ = await app_and_client()
    template = body()["template"]
    template["algorithm"]["parameters"] = [{"name": "lr", "value": "0.1"}]
    async with client(app) as api:
        answer = await api.post("/v2/vision/searches", json=body(template=template))
    assert answer.status_code == 400 and "lr" in answer.json()["error_msg"]


@pytest.mark.asyncio
async def test_another_projects_search_does_not_exist_and_its_project_is_forbidden():
    app, _, tokens = await app_and_client()
    async with client(app) as api:
        search_id = (await api.post("/v2/vision/searches", json=body())).json()["metadata"]["id"]
    token = await add_user(tokens, "bob", ["audio"])
    async with client(app, token) as api:
        assert (await api.get(f"/v2/vision/searches/{search_id}")).status_code == 404
        assert (await api.get("/v2/vision/searches")).status_code == 403
        assert (await api.post("/v2/vision/searches", json=body())).status_code == 403
    async with client(app, None) as api:
        assert (await api.get("/v2/vision/searches")).status_code == 401


@pytest.mark.parametrize(
    "change, named",
    [
        ({"parameters": [{"name": f"p{i}", "value": "1"} for i in range(99)]}, "at most 100 together"),
        ({}, "'TRAINMASTER_SEED' is an environment variable trainmaster sets"),
        ({"secrets": {"lr": "not-a-rate"}}, "param[space] invalid: 'lr' is also a secret of the template"),
    ],
)
async def test_a_search_whose_trials_no_service_would_take_is_refused_naming_why(change, named):
    """Each trial is the template with the space's values appended as parameters, each exported to the task as an
    environment variable: more than 100 together, or one the agent sets, made trials that could never run."""
    app, _, _ = await make_app()
    spec = body()
    spec["template"]["algorithm"].update(change)
    if not change:
        spec["space"]["TRAINMASTER_SEED"] = {"type": "int", "low": 1, "high": 9}
    async with client(app) as admin:
        refused = await admin.post("/v2/vision/searches", json=spec)
    assert refused.status_code == 400 and named in refused.json()["error_msg"], refused.text
    assert "not-a-rate" not in refused.text


async def test_a_search_whose_record_could_outgrow_a_database_document_is_refused_naming_max_trials():
    """A search keeps its trials in one record: 1,000 trials of 50 choices of 256 characters each could pass 16 MiB,
    and its record could then no longer be written (the search stopped moving). Refused naming max_trials and how
    many would fit; a smaller search of the same space is taken."""
    from services.submitter.searches.models import MAX_DOCUMENT_BYTES, SearchCreate, largest_document

    app, _, _ = await app_and_client()
    space = {f"p{i}": {"type": "categorical", "choices": ["é" * 256, "b"]} for i in range(50)}
    spec = body(space=space, max_trials=1000, pruner="none")
    async with client(app) as admin:
        refused = await admin.post("/v2/vision/searches", json=spec)
        assert refused.status_code == 400 and refused.json()["error_msg"].startswith("param[max_trials] invalid:"), (
            refused.text
        )
        most = int(refused.text.split("at most ")[1].split(" ")[0])
        size, _ = largest_document(SearchCreate.model_validate(body(space=space, max_trials=most, pruner="none")))
        assert 0 < most < 1000 and size <= MAX_DOCUMENT_BYTES
        taken = await admin.post("/v2/vision/searches", json=body(space=space, max_trials=most, pruner="none"))
    assert taken.status_code == 201, taken.text


async def test_a_project_runs_at_most_its_cap_of_searches_at_once():
    """Each running search keeps trials queued and running; past the cap a new one is refused (429, naming the
    cap) until one ends, and other projects are not counted."""
    app, db, _ = await make_app()
    app.state.searches = SearchStore(db.api_searches, max_running_per_project=2)
    async with client(app) as api:
        ids = []
        for name in ("a", "b"):
            created = await api.post("/v2/vision/searches", json=body(name=name))
            assert created.status_code == 201, created.text
            ids.append(created.json()["metadata"]["id"])
        refused = await api.post("/v2/vision/searches", json=body(name="c"))
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "10"
        assert refused.json()["error_code"] == "406035"
        assert "running search quantity of project vision" in refused.json()["error_msg"]
        assert "(2 of 2)" in refused.json()["error_msg"]
        assert (await api.post("/v2/audio/searches", json=body(name="c"))).status_code == 201
        db.api_searches.docs[ids[0]]["phase"] = "Completed"
        assert (await api.post("/v2/vision/searches", json=body(name="c"))).status_code == 201
    assert sorted(d["name"] for d in db.api_searches.docs.values() if d["project_id"] == "vision") == ["a", "b", "c"]


async def test_a_trial_job_of_a_running_search_is_not_deleted(monkeypatch):
    from services.submitter import usecases

    """Its hours count against the search's budget, read from its job: deleting finished trial jobs refunded the
    budget (found by review). Once the search ended, its trial jobs go as any finished job."""
    app, db, _ = await make_app()
    app.state.searches = SearchStore(db.api_searches)
    async with client(app) as api:
        search_id = (await api.post("/v2/vision/searches", json=body())).json()["metadata"]["id"]
        trial = {"_id": f"{search_id}-t0", "project_id": "vision", "user_name": "admin", "search_id": search_id}
        await db.api_jobs.insert_one({**trial, "status": {"phase": "Completed"}})
        refused = await api.delete(f"/v2/vision/training-jobs/{search_id}-t0")
        assert refused.status_code == 409, refused.text
        assert f"a trial of search {search_id}, which runs" in refused.json()["error_msg"]
        assert "stop the search first" in refused.json()["error_msg"]
        assert await db.api_jobs.find_one({"_id": f"{search_id}-t0"}) is not None
        db.api_searches.docs[search_id]["phase"] = "Stopped"
        deleted = []

        async def announced(broker, message):  # the deletion's announcement (the fake broker publishes nothing)
            deleted.append(message.job_id)

        monkeypatch.setattr(usecases, "publish", announced)
        assert (await api.delete(f"/v2/vision/training-jobs/{search_id}-t0")).status_code == 204
        assert deleted == [f"{search_id}-t0"] and await db.api_jobs.find_one({"_id": f"{search_id}-t0"}) is None


def test_a_cpu_only_trial_has_a_price_per_hour():
    """A search's max_dollars was priced per GPU-hour: a template without GPUs cost $0 an hour, never spent."""
    from types import SimpleNamespace

    from shared.jobs import JobCreate
    from services.submitter.admission import price_per_hour

    template = JobCreate.model_validate({"algorithm": {"command": "true"}, "spec": {"resource": {"gpu_count": 0}}})
    answer = SimpleNamespace(candidates=[SimpleNamespace(expected_cost=4.0, predicted_duration_s=7200.0)])
    assert price_per_hour(template, answer) == 2.0
