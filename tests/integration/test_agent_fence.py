"""A real agent (its own process and credentials) cut off from a real NATS server: the server is killed under it
while its task runs; the agent stops the task itself while the bus is still gone, and reports its end once the
server is back."""

import asyncio
import random
import signal

import nats
import psutil
import pytest

from shared.bus import connect, make_broker, publish, stream_of
from shared.events import NodeHeartbeat, TaskExited
from services.stack.processes import Stack, StackSettings
from tests.conftest import eventually, free_port
from tests.factories import start_task, unique

pytestmark = pytest.mark.integration
CLUSTER = '[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\n'
EXITED = "tm.job.task.n1.exited"


@pytest.fixture
def stack(tmp_path):
    """NATS with n1's identity and command consumer, and n1's agent (3 s node timeout, fenced after 2 s)."""
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    stack = Stack(
        StackSettings(
            data_dir=tmp_path / "data",
            nats_port=free_port(),
            nats_url=None,
            mongo_url=None,
            cluster_file=tmp_path / "cluster.toml",
            heartbeat_interval_s=0.5,
            node_timeout_s=3,
        ),
        extra_env={
            "TRAINMASTER_USE_NVML": "false",
            "TRAINMASTER_FENCE_MARGIN_S": "1.0",
            "TRAINMASTER_FENCE_GRACE_S": "0.1",
        },
    )
    try:
        stack.start_nats()
        stack.prepare_bus()
        stack.start_agent("n1")
        yield stack
    finally:
        stack.stop_all()


async def last_exit(js) -> TaskExited | None:
    """The last end n1's agent reported, if any."""
    try:
        msg = await js.get_last_msg(stream_of(EXITED).name, EXITED)
    except nats.js.errors.NotFoundError:
        return None
    return TaskExited.model_validate_json(msg.data)


def processes(argv: list[str]) -> list[psutil.Process]:
    """Live processes running exactly `argv` (a zombie is dead)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["cmdline"] == argv and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


async def test_an_agent_cut_off_from_the_bus_stops_its_task_and_reports_it_when_the_bus_is_back(stack):
    job_id, seconds = unique("j"), f"{random.randint(100_000, 999_999)}"
    admin = make_broker(stack.nats_url, name="admin", creds=stack.admin_creds())
    await connect(admin, declare=False)
    await publish(  # the agent reads it once it is up
        admin,
        start_task(job_id, f"exec sleep {seconds}"),
    )
    await admin.stop()

    async def task_runs() -> bool:
        return bool(processes(["sleep", seconds]))

    await eventually(task_runs, timeout_s=60)
    stack.signal("nats", signal.SIGKILL)  # the bus is gone; the agent lives on, its task with it for now

    async def task_gone() -> bool:
        return not processes(["sleep", seconds])

    await eventually(task_gone, timeout_s=30)
    assert stack.processes["agent-n1"].poll() is None  # the agent stopped its task, not itself
    stack.start_nats()
    nc = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    try:
        js = nc.jetstream()

        exited = await eventually(lambda: last_exit(js), timeout_s=60)
        assert (exited.job_id, exited.reason, exited.message) == (job_id, "terminated", "stopped: fenced")
    finally:
        await nc.close()
        await asyncio.sleep(0)


async def test_a_start_issued_before_the_bus_went_away_and_delivered_after_never_runs(stack):
    """The monitor's outbox relays a start it wrote before it called the node lost (and dropped its queued starts)
    only once the bus is back: the agent, which went unheard past its window meanwhile, refuses it and reports it;
    a start issued at the count its heartbeats now carry runs."""
    stale_job, fresh_job = unique("j"), unique("j")
    seconds = f"{random.randint(100_000, 999_999)}"
    nc = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    beats = await nc.subscribe("tm.node.evt.n1.heartbeat")
    assert NodeHeartbeat.model_validate_json((await beats.next_msg(timeout=30)).data).silences == 0
    await nc.close()
    stack.signal("nats", signal.SIGKILL)
    await asyncio.sleep(3)  # past the agent's 2 s window: it counts a silence (the monitor would call n1 lost)
    stack.start_nats()
    nc = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    try:
        beats = await nc.subscribe("tm.node.evt.n1.heartbeat")
        silences = 0
        while silences == 0:  # the first heartbeat since the bus came back may be sent before our subscription
            silences = NodeHeartbeat.model_validate_json((await beats.next_msg(timeout=60)).data).silences
        admin = make_broker(stack.nats_url, name="admin", creds=stack.admin_creds())
        await connect(admin, declare=False)
        await publish(admin, start_task(stale_job, f"exec sleep {seconds}"))  # issued at 0, relayed now
        js = nc.jetstream()

        refused = await eventually(lambda: last_exit(js), timeout_s=60)
        assert (refused.job_id, refused.reason) == (stale_job, "terminated")
        assert refused.message.startswith("refused") and not processes(["sleep", seconds])
        # a start taken before the agent's first heartbeat since the bus came back is acknowledged would still be
        # fenced (the same silence): wait for a heartbeat sent after the refusal, acknowledged by the time it is read
        while NodeHeartbeat.model_validate_json((await beats.next_msg(timeout=30)).data).occurred_at <= (
            refused.ended_at
        ):
            pass
        await publish(admin, start_task(fresh_job, f"exec sleep {seconds}").model_copy(update={"silences": silences}))
        await admin.stop()

        async def fresh_runs() -> bool:
            return bool(processes(["sleep", seconds]))

        await eventually(fresh_runs, timeout_s=60)
    finally:
        await nc.close()


async def test_no_heartbeat_due_while_the_bus_was_gone_is_sent_once_it_is_back(stack):
    """nats-py buffers what is published while it reconnects and sends it once connected: the heartbeats due during
    the outage came first, with the node's state and count of silences as they were then, and the monitor took them
    as current (a start issued meanwhile carried the old count and was refused). The agent sends none while its
    connection is down: the first heartbeat after the outage is current."""
    nc = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    beats = await nc.subscribe("tm.node.evt.n1.heartbeat")
    assert NodeHeartbeat.model_validate_json((await beats.next_msg(timeout=30)).data).silences == 0
    await nc.close()
    stack.signal("nats", signal.SIGKILL)
    await asyncio.sleep(3)  # six heartbeats due, and past the agent's 2 s window: it counts a silence
    stack.signal("agent-n1", signal.SIGSTOP)  # held until we listen, so that nothing it sends on reconnecting is missed
    try:
        stack.start_nats()
        nc = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
        beats = await nc.subscribe("tm.node.evt.n1.heartbeat")
        await nc.flush()
    finally:
        stack.signal("agent-n1", signal.SIGCONT)
    try:
        first = NodeHeartbeat.model_validate_json((await beats.next_msg(timeout=60)).data)
        assert first.silences >= 1, first
    finally:
        await nc.close()
