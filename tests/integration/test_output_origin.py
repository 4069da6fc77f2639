"""Output on a real NATS server configured as `make run` does: one node's agent, with its own credentials, publishes
chunks on its own log subject naming a job placed on another node, first and with the sequence numbers (and
message ids) the real chunks will carry; the submitter stores none of them, and the real output arrives whole."""

import asyncio

import pytest

from shared.bus import LOG_STREAM_MAX_BYTES, LOGS, connect, make_broker, publish, read_up
from shared.origin import Origins
from shared.store import make_client
from services.submitter.handlers import PLACED, router
from services.submitter.logs import read_page
from services.submitter.repository import Repository
from tests.factories import chunk, placed, unique
from tests.integration.test_bus_security import agent_creds, as_agent

pytestmark = pytest.mark.integration
INJECTED = ('TRAINMASTER_METRICS {"loss": 0.00001}', "target reached")


@pytest.fixture
async def submitter(cluster_servers):
    """The submitter's bus handlers, as the submitter (its own credentials), on the real server and database."""
    broker = make_broker(
        cluster_servers.nats_url, name="submitter", creds=cluster_servers.identities.creds("submitter")
    )
    broker.include_router(router)
    client = make_client(cluster_servers.mongo_url_of("submitter"))
    db = client[unique("db").replace("-", "_")]
    repo = Repository(
        db=db, broker=broker, origins=Origins(placements=db.api_placements, all_read=lambda: read_up(broker, PLACED))
    )
    broker.context.set_global("repo", repo)
    await connect(broker)
    await broker.start()
    yield broker, repo
    await broker.stop()
    await client.close()


async def as_node(cluster_servers, node_id: str):
    broker = make_broker(cluster_servers.nats_url, name=f"agent-{node_id}", creds=agent_creds(cluster_servers, node_id))
    await connect(broker, declare=False)
    return broker


async def until(check, *, tries: int = 100) -> bool:
    for _ in range(tries):
        if await check():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_another_nodes_chunks_are_dropped_and_the_real_output_is_not_stopped(cluster_servers, submitter):
    broker, repo = submitter
    job_id = unique("j")
    placement = make_broker(
        cluster_servers.nats_url, name="placement", creds=cluster_servers.identities.creds("placement")
    )
    await connect(placement)
    await publish(placement, placed(job_id, nodes=("n2",)))
    await placement.stop()

    attacker, raw = await as_node(cluster_servers, "n1"), await as_agent(cluster_servers, "n1")
    for seq in range(3):  # first, with the numbers the real chunks will carry, and with their bare message ids
        forged = chunk(job_id, node_id="n1", seq=seq, lines=INJECTED, last=seq == 2)
        await publish(attacker, forged)
        for msg_id in (f"{job_id}:1:0:n2:log:{seq}", f"{job_id}:1:0:log:{seq}"):
            await raw.nc.jetstream().publish(
                forged.subject, forged.model_dump_json().encode(), headers={"Nats-Msg-Id": msg_id}
            )
    await publish(attacker, chunk(job_id, attempt=7, node_id="n1", lines=INJECTED))  # an attempt never placed
    await attacker.stop()
    await raw.nc.close()

    runner = await as_node(cluster_servers, "n2")
    for seq in range(3):
        await publish(runner, chunk(job_id, node_id="n2", seq=seq, lines=(f"real {seq}",), last=seq == 2))
    await runner.stop()

    assert await until(lambda: repo.output.complete(job_id, attempt=1, rank=0))
    page = await read_page(repo.output, job_id, rank=0, offset=0, limit=100)
    assert page.text.splitlines() == ["real 0", "real 1", "real 2"]
    assert await repo.output.chunks.count_documents({"job_id": job_id}) == 3
    # nothing left waiting: the chunk of the attempt never placed was judged once every placement was read
    logs = {"stream": LOGS, "durable": "submitter-logs"}
    assert await until(lambda: read_up(broker, logs))


async def test_the_output_stream_keeps_at_most_its_configured_bytes(cluster_servers):
    broker = make_broker(cluster_servers.nats_url, name="operator", creds=cluster_servers.admin_creds())
    streams = []
    for configured in (64 * 1024**2, LOG_STREAM_MAX_BYTES):  # the operator's declaration with another setting
        await connect(broker, declare=True, log_max_bytes=configured, shrink=True)
        streams.append((await broker.config.connection_state.stream.stream_info(LOGS.name)).config.max_bytes)
        await broker.stop()
    assert streams == [64 * 1024**2, LOG_STREAM_MAX_BYTES] and 0 < LOG_STREAM_MAX_BYTES <= 16 * 1024**3
