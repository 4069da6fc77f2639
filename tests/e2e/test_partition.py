"""A node cut off from the bus while its job runs (its connection stays open, nothing gets through): the monitor
declares it lost and runs the job again on the other node, and its own agent has stopped the first attempt before
that: the two attempts never run at the same time."""

import contextlib
import socket
import threading

import httpx
import pytest

from tests.conftest import eventually, wait_until_ready
from tests.e2e.helpers import submit, wait_phase
from tests.e2e.outcomes import assert_attempts_never_overlapped
from tests.e2e.scripts import quote

pytestmark = pytest.mark.e2e
LOCAL = ("local-1", "local-2")  # the nodes a job with allowed = "local" may run on
# The first attempt ticks for 15 s, long past the cut: unstopped, it would tick on beside the next attempt. The next
# one, after the loss, runs its remaining steps at once (it waited the steps out at the first one's pace: 13 s more).
TICKING = r"""
import json, os, sys, time
marker, ckpt = sys.argv[1], os.path.join(os.environ["TRAINMASTER_CHECKPOINT_DIR"], "step")
start = int(open(ckpt).read()) + 1 if os.path.exists(ckpt) else 0
pause = 0.1 if os.environ["TRAINMASTER_ATTEMPT"] == "1" else 0.01
for step in range(start, 150):
    with open(marker, "a") as f:
        f.write(f"{os.environ['TRAINMASTER_JOB_ID']} {os.environ['TRAINMASTER_ATTEMPT']} {time.time():.3f}\n")
    time.sleep(pause)
    with open(ckpt + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
"""


class Partition:
    """A TCP relay from an agent to the NATS server that can drop every byte both ways while the connections stay
    open (a partition), then heal: the connections it spoiled are closed and new ones relayed."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            with self.lock:
                self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    break
                if not self.cut.is_set():
                    sink.sendall(data)
            except OSError:
                break
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        with self.lock:
            spoiled, self.sockets = self.sockets, []
        for s in spoiled:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.cut.clear()

    def close(self) -> None:
        self.listener.close()
        self.heal()


async def boot_ids(api: httpx.AsyncClient) -> dict[str, str]:
    """Each local node's agent as the monitor knows it (its boot id); none when the API does not answer."""
    try:
        nodes = (await api.get("/v2/nodes")).json()["items"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}
    return {n["node_id"]: n["boot_id"] for n in nodes if n["node_id"] in LOCAL}


async def restarted(api: httpx.AsyncClient, stack, before: dict[str, str]) -> None:
    """Every local node ready again under an agent other than `before`'s, then the whole stack ready. The stack's
    readiness alone took the agents just stopped for the nodes' word: a node is lost only after the node timeout,
    so it was met at once, before the new agents were up, and the old agent's silence then had the monitor call
    the node lost under the next steps (the next test, when it is the clean-up's)."""

    async def new_agents() -> dict | None:
        try:
            nodes = {n["node_id"]: n for n in (await api.get("/v2/nodes")).json()["items"]}
        except httpx.HTTPError:
            return None
        up = [n for n in LOCAL if nodes.get(n, {}).get("state") not in (None, "lost")]
        return nodes if all(n in up and nodes[n]["boot_id"] != before.get(n) for n in LOCAL) else None

    await eventually(new_agents, timeout_s=60)
    wait_until_ready(stack)


def restart_agent(stack, node_id: str, nats_url: str | None) -> None:
    """The node's agent again, connected through `nats_url` (None: the server itself)."""
    stack.stop(f"agent-{node_id}")
    if nats_url:
        stack.extra_env["TRAINMASTER_NATS_URL"] = nats_url
    try:
        stack.start_agent(node_id)
    finally:
        stack.extra_env.pop("TRAINMASTER_NATS_URL", None)


async def test_a_node_cut_off_from_the_bus_stops_its_attempt_before_the_next_one_starts(
    api, project, stack, shared_dir
):
    marker = shared_dir / "ticks"
    marker.touch()
    marker.chmod(0o666)  # appended to by both attempts, each its own user
    partitions = {node_id: Partition(stack.settings.nats_port) for node_id in LOCAL}
    try:
        before = await boot_ids(api)
        for node_id, partition in partitions.items():
            restart_agent(stack, node_id, f"nats://127.0.0.1:{partition.port}")
        await restarted(api, stack, before)
        job = await submit(
            api,
            project,
            command=f"python3 -c {quote(TICKING)} {marker}",
            allowed="local",
            cpu_count=0.5,
            memory_gb=0.5,
        )
        job_id = job["metadata"]["id"]
        first = await wait_phase(api, project, job_id, "Running")
        lost_node = first["status"]["node_id"]
        partitions[lost_node].cut.set()
        done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=90)
        partitions[lost_node].heal()
        assert done["status"]["phase"] == "Completed", done["status"]
        second = done["status"]["attempts"][-1]
        assert second["node_ids"] != [lost_node] and second["reason"] == "node_lost", done["status"]["attempts"]
        assert_attempts_never_overlapped(marker, [done])
    finally:
        for partition in partitions.values():
            partition.close()
        before = await boot_ids(api)
        for node_id in LOCAL:
            restart_agent(stack, node_id, None)
        await restarted(api, stack, before)
