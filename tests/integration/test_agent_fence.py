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
from shared.events import TaskExited
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

        async def reported() -> TaskExited | None:
            try:
                msg = await js.get_last_msg(stream_of(EXITED).name, EXITED)
            except nats.js.errors.NotFoundError:
                return None
            return TaskExited.model_validate_json(msg.data)

        exited = await eventually(reported, timeout_s=60)
        assert (exited.job_id, exited.reason, exited.message) == (job_id, "terminated", "stopped: fenced")
    finally:
        await nc.close()
        await asyncio.sleep(0)
