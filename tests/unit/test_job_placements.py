"""GET .../training-jobs/{id}/placements: each attempt's nodes and why placement chose them, as the submitter read
it from placement's own event; another project's job does not exist for the caller."""

from shared.origin import Origins
from tests.factories import placed
from tests.unit.api_app import add_user, client, make_app


async def always() -> bool:
    return True


async def test_a_jobs_placements_say_where_and_why():
    app, db, tokens = await make_app()
    app.state.submitter.repo.origins = Origins(placements=db.api_placements, all_read=always)
    await db.api_jobs.insert_one({"_id": "j-1", "project_id": "vision", "user_name": "ana"})
    event = placed("j-1", nodes=("reserved-1",)).model_copy(update={"why": "reserved-1 (reserved) ends in 1.0 min"})
    await app.state.submitter.repo.origins.placed(event)
    ana = await add_user(tokens, "ana", ["vision"])
    bob = await add_user(tokens, "bob", ["other"])
    async with client(app, ana) as api:
        answer = await api.get("/v2/vision/training-jobs/j-1/placements")
        assert answer.status_code == 200, answer.text
        assert answer.json() == [
            {"attempt": 1, "nodes": {"0": "reserved-1"}, "why": "reserved-1 (reserved) ends in 1.0 min"}
        ]
    async with client(app, bob) as api:
        assert (await api.get("/v2/vision/training-jobs/j-1/placements")).status_code in (403, 404)
