"""The placement records a receiver of output keeps (`shared.origin`: the submitter's and the estimator's), on a real
NATS server and database configured as `make run` does: placements read together are stored together, in one
grouped write, not one command each; each is stored once, and a chunk of output is still judged by them."""

import pytest
from pymongo import AsyncMongoClient

from shared.bus import LOGS, connect, make_broker, publish, read_up
from shared.origin import Origins
from services.submitter.handlers import PLACED, router
from services.submitter.logs import read_page
from services.submitter.repository import Repository
from tests.factories import chunk, placed, unique
from tests.integration.test_output_origin import as_node, until
from tests.integration.test_status_writes import Commands

pytestmark = pytest.mark.integration
BURST = 40


async def test_placements_read_together_are_stored_in_one_grouped_write(cluster_servers):
    placement = make_broker(
        cluster_servers.nats_url, name="placement", creds=cluster_servers.identities.creds("placement")
    )
    await connect(placement)
    jobs = [unique("j") for _ in range(BURST)]
    for job_id in jobs:  # a burst of placements, all stored before the submitter reads one
        await publish(placement, placed(job_id, nodes=("n1",)))
    await publish(placement, placed(jobs[0], nodes=("n1",)).model_copy(update={"event_id": unique("again")}))
    await placement.stop()

    commands = Commands()
    client = AsyncMongoClient(cluster_servers.mongo_url_of("submitter"), tz_aware=True, event_listeners=[commands])
    db = client[unique("db").replace("-", "_")]
    broker = make_broker(
        cluster_servers.nats_url, name="submitter", creds=cluster_servers.identities.creds("submitter")
    )
    broker.include_router(router)
    origins = Origins(placements=db.api_placements, all_read=lambda: read_up(broker, PLACED))
    repo = Repository(db=db, broker=broker, origins=origins)
    broker.context.set_global("repo", repo)
    await connect(broker)
    await broker.start()
    try:
        assert await until(lambda: read_up(broker, PLACED), tries=200)
        stored = {d["_id"]: d["nodes"] async for d in db.api_placements.find({"job_id": {"$in": jobs}})}
        assert stored == {f"{job_id}:1": {"0": "n1"} for job_id in jobs}  # each once (the repeat inserted nothing)
        writes = commands.sent["insert"] + commands.sent["bulkWrite"]
        assert 1 <= writes <= BURST // 4  # one insert a placement before: 41

        # a chunk from the node its rank was placed on is taken; another node's is not
        runner, other = await as_node(cluster_servers, "n1"), await as_node(cluster_servers, "n2")
        await publish(other, chunk(jobs[-1], node_id="n2", lines=("forged",)))
        await publish(runner, chunk(jobs[-1], node_id="n1", lines=("real",), last=True))
        await runner.stop()
        await other.stop()
        assert await until(lambda: repo.output.complete(jobs[-1], attempt=1, rank=0))
        assert await until(lambda: read_up(broker, {"stream": LOGS, "durable": "submitter-logs"}))
        page = await read_page(repo.output, jobs[-1], rank=0, offset=0, limit=100)
        assert page.text.splitlines() == ["real"]
    finally:
        await broker.stop()
        await client.close()
