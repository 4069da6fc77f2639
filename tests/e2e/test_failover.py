"""No single point of failure: three NATS servers, two replicas of every service. While 50 checkpointing jobs flow,
one NATS server (the jobs stream's leader), the leading placement, monitor and billing, and one API replica are
SIGKILLed in turn, two seconds apart, and not restarted (one that exits on its own is, as `make run` does): every
job ends exactly once, no two attempts of a job overlap, the API answers through the other replica, each killed
leader's replica takes over (the three takeovers overlap, each timed from its own kill), and the usage ledger holds
one line per attempt that ran."""

import asyncio
import json
import signal
import time

import httpx
import nats
import pytest

from shared.bus import LEASES
from services.stack.processes import Stack, free_ports_at
from tests.conftest import ADMIN_TOKEN, CLUSTER, eventually, exchange, start_stack, stop_later
from tests.e2e.outcomes import all_finished, assert_attempts_never_overlapped, ledger_settles
from tests.e2e.test_chaos import ticking
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e
JOBS = 50
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANSWER_WITHIN_S = 30  # a request goes on to the other replica, and again, this long (the CLI's 20 s, and more)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory, servers):
    stack = start_stack(
        tmp_path_factory.mktemp("replicated"),
        cluster=CLUSTER,
        servers=servers,
        nats_servers=3,
        service_replicas=2,
        nats_port=free_ports_at(0, 1, 2, 10, 11, 12),
        api_port=free_ports_at(0, 1),
    )
    yield stack
    stop_later(stack)


class Api:
    """Both API replicas: a request goes to the first that answers (the CLI and portal sit behind a balancer)."""

    def __init__(self, stack: Stack) -> None:
        ports = (stack.settings.api_port, stack.settings.api_port + 1)
        self.clients = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}", headers=HEADERS, timeout=10) for p in ports]
        self.failed = 0

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        """The first answer below 500, asking each replica in turn for up to ANSWER_WITHIN_S (a number of rounds
        was as short as ten seconds when both refuse at once: a killed replica and one taking over)."""
        deadline = time.monotonic() + ANSWER_WITHIN_S
        while time.monotonic() < deadline:
            for client in self.clients:
                try:
                    response = await client.request(method, url, **kwargs)
                    if response.status_code < 500:
                        return response
                except httpx.TransportError:
                    pass
                self.failed += 1
            await asyncio.sleep(0.1)
        raise AssertionError(f"no API replica answered {method} {url}")

    async def get(self, url: str, **kwargs) -> httpx.Response:
        return await self.request("GET", url, **kwargs)

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


async def leader(stack: Stack, nc, service: str) -> str:
    """The process that holds the service's leader lease, by the pid its lease names."""
    entry = await nc.jetstream().get_last_msg(LEASES.name, f"$KV.tm_leaders.{service}")
    pid = int(json.loads(entry.data)["holder"].split(":")[1])
    [name] = [name for name, process in stack.processes.items() if process.pid == pid]
    return name


async def test_one_of_each_killed_in_turn_loses_no_job_and_runs_none_twice(replicated):
    stack, project, api = replicated, "failover", Api(replicated)
    marker = exchange(stack.settings.data_dir) / "ticks"
    marker.touch()
    marker.chmod(0o666)  # appended to by every job, each its own user
    admin = await nats.connect(
        stack.nats_url.split(","),
        user_credentials=str(stack.admin_creds()),
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
    )
    kills, takeovers = [], {}
    takeover_waits: list[asyncio.Task] = []
    # Each killed process stays dead; one that exits on its own (a leader that could not renew its lease while
    # its bus server was down exits, by design) is started again, as `make run`'s supervisor does.
    never_again: dict[str, float] = {}

    async def supervise() -> None:
        while True:
            restarted.extend(name for name, _ in stack.restart_dead(never_again))
            await asyncio.sleep(0.5)

    restarted: list[str] = []

    async def submit_all() -> None:
        for _ in range(JOBS):
            body = job_body(name=unique("f"), command=ticking(marker), cpu_count=0.5, memory_gb=0.5)
            response = await api.request("POST", f"/v2/{project}/training-jobs", json=body)
            assert response.status_code in (201, 409), response.text  # 409: an earlier try got through
            await asyncio.sleep(0.1)

    async def taken_over(service: str, victim: str, killed_at: float) -> None:
        await eventually(lambda: _new_leader(stack, admin, service, victim), timeout_s=30, interval_s=0.2)
        takeovers[service] = round(time.monotonic() - killed_at, 1)

    async def kill_in_turn() -> None:
        await asyncio.sleep(1.5)
        # Each takeover is awaited beside the kills after it, timed from its own kill: awaited in turn, each cost a
        # lease's time to live (LEASE_TTL_S), and three services left without a leader at once is the harsher case.
        for turn in ("nats", "placement", "monitor", "billing", "submitter"):
            # each leader looked up just before its kill: an earlier kill may have moved it (a standby killed
            # instead would test no takeover)
            if turn == "nats":
                victim = (await admin.jetstream().stream_info("TM_JOBS")).cluster.leader
            elif turn == "submitter":
                victim = turn
            else:
                victim = await eventually(lambda s=turn: _leader_now(stack, admin, s), timeout_s=30, interval_s=0.2)
            never_again[victim] = float("inf")
            stack.signal(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            kills.append(victim)
            for service in ("placement", "monitor", "billing"):
                if victim.startswith(service):
                    takeover_waits.append(asyncio.create_task(taken_over(service, victim, killed_at)))
            await asyncio.sleep(2)
        await asyncio.gather(*takeover_waits)

    supervisor = asyncio.create_task(supervise())
    try:
        await asyncio.gather(submit_all(), kill_in_turn())

        items = await all_finished(api, project, jobs=JOBS, context=f"kills {kills}")
        assert {j["status"]["phase"] for j in items} == {"Completed"}
        assert_attempts_never_overlapped(marker, items)  # no decision taken twice
        await ledger_settles(api, project)
        assert set(takeovers) == {"placement", "monitor", "billing"}
        figures = {"kills": kills, "takeover_s": takeovers, "failed_requests": api.failed, "restarted": restarted}
        print("\nFAILOVER " + json.dumps(figures))
    finally:
        supervisor.cancel()
        for wait in takeover_waits:  # none left running on a closed connection when a kill failed
            wait.cancel()
        await admin.close()
        await api.close()


async def _leader_now(stack: Stack, nc, service: str) -> str | None:
    try:
        return await leader(stack, nc, service)
    except (ValueError, nats.errors.Error):  # no lease held at this moment (a takeover under way)
        return None


async def _new_leader(stack: Stack, nc, service: str, dead: str) -> str | None:
    try:
        name = await leader(stack, nc, service)
    except (ValueError, nats.errors.Error):  # the dead one's lease not yet gone, or none held at this moment
        return None
    return name if name != dead else None
