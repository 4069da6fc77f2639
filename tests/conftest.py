"""Fixtures shared by every tier: the whole stack on free ports in a temporary directory."""

import asyncio
import json
import os
import re
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio
from _pytest.nodeid import coerce_node_id

from services.stack.processes import Stack, StackSettings, free_ports_at

# `make test` runs two pytest-xdist workers on two cores: each worker's numerical libraries (and the jobs its stacks
# run) get one thread, set before numpy or torch loads (nothing above imports them). With a thread a core each, two
# workers training at once spin against each other (OpenMP waits by spinning): a 15-s test took 300 s beside another.
for _pool in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

ADMIN_TOKEN = "test-admin-token-0123456789abcdef01"  # the submitter refuses fewer than 32 characters
CLUSTER = """
[[nodes]]
id = "local-1"
kind = "local"
pool = "lab"
cpu_count = 16
memory_gb = 64
price_per_hour = 0.5
gpus = [{ model = "RTX-4090", memory_gb = 24, tflops = 165, count = 2 }]

[[nodes]]
id = "local-2"
kind = "local"
pool = "lab"
cpu_count = 8
memory_gb = 32
price_per_hour = 0.4
gpus = [{ model = "RTX-3090", memory_gb = 24, tflops = 71, count = 1 }]

[[nodes]]
id = "reserved-1"
kind = "reserved"
cpu_count = 16
memory_gb = 64
price_per_hour = 1.5
gpus = [{ model = "A100-40GB", memory_gb = 40, tflops = 312, count = 1 }]

[[nodes]]
id = "ondemand-1"
kind = "on_demand"
cpu_count = 16
memory_gb = 128
price_per_hour = 3.6
gpus = [{ model = "A100-80GB", memory_gb = 80, tflops = 312, count = 1 }]

# the default engine of the cluster `make run` starts (cluster.toml): the agent's own environment
[[engines]]
name = "pytorch"
environment = "agent"
default = true
"""


WORKER: dict[str, str] = {}  # this process's pytest-xdist worker ("gw0", "gw1"), when it is one


def pytest_configure(config) -> None:
    if workerinput := getattr(config, "workerinput", None):
        WORKER["id"] = workerinput["workerid"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """For `make test` (`-n 2 --dist loadgroup`): a module's tests run on one worker, so each module-scoped stack
    starts once; the tests of the watched jobs (tests/e2e/watches.py) run on one worker, so the jobs run once, beside
    the test that only waits with them; the GPU tier on one, with one stack on the GPUs and one report. The
    session's own `stack` starts once per worker that needs it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = (
                "eta-watches"
                if "watches" in item.fixturenames
                else "gpu"
                if item.nodeid.startswith("tests/gpu/")
                else item.nodeid.split("::")[0]
            )
            item.add_marker(pytest.mark.xdist_group(group))
    # Longest first, then the whole-stack tiers before the quick ones: the two workers then end together, not one
    # idling while the other runs a long group it took last.
    items.sort(key=_dispatch_rank)
    SESSION_STACK["last"] = max((_dispatch_rank(i)[0] for i in items if "stack" in i.fixturenames), default=-1)
    if config is not None and config.getoption("loadgroup", default=False):
        for item in items:
            _name_the_group(item)


# The longest groups, as measured from a fresh clone (`TRAINMASTER_TEST_TIMELINE`, docs/operations.md "Tests"). The
# watched jobs' group starts with the README's test, which computes while they wait.
LONGEST = (
    "eta-watches",
    "tests/e2e/test_task_isolation.py",
    "tests/e2e/test_recovery.py",
    "tests/e2e/test_failover.py",
    "tests/integration/test_provider_ec2.py",
    "tests/e2e/test_chaos.py",
    "tests/e2e/test_edge_limits.py",
    "tests/e2e/test_cli.py",
    "tests/e2e/test_portal.py",
    "tests/e2e/test_costs.py",
    "tests/integration/test_provider_kubernetes.py",
    "tests/e2e/test_placement_renting.py",
)
TIERS = ("tests/gpu/", "tests/e2e/", "tests/integration/", "tests/service/", "tests/unit/")


def _dispatch_rank(item) -> tuple[int, bool]:
    """The group's place, then, within it, a test that waits on a watched job after those that run beside them."""
    marker = item.get_closest_marker("xdist_group")
    group = marker.args[0] if marker and marker.args else ""
    watched = item.get_closest_marker("watched") is not None
    if group in LONGEST:
        return LONGEST.index(group), watched
    tier = next((i for i, prefix in enumerate(TIERS) if item.nodeid.startswith(prefix)), len(TIERS))
    return len(LONGEST) + tier, watched


def _name_the_group(item) -> None:
    """What pytest-xdist 3.8 means to do for `--dist loadgroup` and no longer does under pytest 9.2: end the test's
    id with "@<group>", the one thing the scheduler groups by (xdist writes `item._nodeid`, which pytest 9.2 does
    not read: every module's tests, and the MLPerf replays, were spread over both workers)."""
    marker = item.get_closest_marker("xdist_group")
    group = marker.args[0] if marker.args else marker.kwargs.get("name", "default")
    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With TRAINMASTER_TEST_TIMELINE=<file>: one JSON line per test (worker, start, seconds, group) appended to it,
    to see which worker the suite waits for (docs/operations.md, "Tests")."""
    timeline = os.environ.get("TRAINMASTER_TEST_TIMELINE")
    started = time.time()
    yield
    if timeline:
        group = item.get_closest_marker("xdist_group")
        line = {
            "worker": WORKER.get("id", "main"),
            "test": item.nodeid,
            "group": group.args[0] if group and group.args else "",
            "start": round(started, 2),
            "seconds": round(time.time() - started, 2),
        }
        with open(timeline, "a") as f:
            f.write(json.dumps(line) + "\n")


def free_port() -> int:
    """A free loopback port outside the range outgoing connections take theirs from (`free_ports_at`)."""
    return free_ports_at(0)


def docker_answers() -> bool:
    """Whether a Docker engine runs here (the client alone is not enough)."""
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def servers():
    """Real MongoDB 7 in a container when Docker answers; else the stack starts a local server. NATS is always the
    stack's own: it is configured with the stack's operator and accounts (no anonymous clients)."""
    if not docker_answers():
        yield {}
        return
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    mongo = DockerContainer("mongo:8.0").with_exposed_ports(27017)
    with mongo:
        wait_for_logs(mongo, "Waiting for connections")
        yield {"mongo_url": f"mongodb://{mongo.get_container_host_ip()}:{mongo.get_exposed_port(27017)}"}


def start_stack(
    data, *, cluster: str, servers: dict, extra_env: dict[str, str] | None = None, **settings: Any
) -> Stack:
    """The whole stack on free ports under `data`, ready (every node of `cluster` registered); `settings`
    override StackSettings (a NATS cluster, service replicas)."""
    (data / "cluster.toml").write_text(cluster)
    exchange(data).mkdir(mode=0o777)
    exchange(data).chmod(0o777)  # tasks run as users of their own: a place both they and the tests may write
    settings = StackSettings(
        **{
            "data_dir": data,
            "nats_port": free_port(),
            "api_port": free_port(),
            "cluster_file": data / "cluster.toml",
            "admin_token": ADMIN_TOKEN,
            "heartbeat_interval_s": 0.5,
            "node_timeout_s": 3,
            "checkpoint_sync_s": 0.5,
            "mongo_url": servers.get("mongo_url"),
            **settings,
        }
    )
    stack = Stack(
        settings,
        extra_env={
            "TRAINMASTER_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",  # the tests' local webhook receivers
            "TRAINMASTER_TASK_SHARED_DIRS": json.dumps([str(exchange(data))]),
            "TRAINMASTER_HANG_GRACE_S": "1",  # jobs suspected hung restart soon
            "TRAINMASTER_BUDGET_CHECK_S": "1",  # budgets checked each second, not each 5
            "TRAINMASTER_SEARCH_PASS_S": "0.5",  # a search's next trial goes out, and its end is seen, sooner than 2 s
            # the 3 s node timeout: agents fence after 2 s unacknowledged (4 heartbeats), their tasks 0.1 s grace
            "TRAINMASTER_FENCE_MARGIN_S": "1.0",
            "TRAINMASTER_FENCE_GRACE_S": "0.1",
            **(extra_env or {}),
        },
    )
    try:
        stack.start_all()
        wait_until_ready(stack)
    except Exception:
        stack.stop_all()
        dump_logs(stack)
        raise
    return stack


STOPPING: list[threading.Thread] = []  # module stacks stopping (stop_later), waited for at the session's end


def stop_later(stack: Stack) -> None:
    """Stop a module's stack in a thread of its own: the next module's tests start meanwhile, not after the seconds
    its agents take to stop their tasks; the session waits for every one before it ends."""
    thread = threading.Thread(target=stack.stop_all, name=f"stop-{stack.data_dir.name}")
    thread.start()
    STOPPING.append(thread)


def stops_done() -> None:
    """Wait for the module stacks still stopping (a test that measures load starts on a quiet machine)."""
    for thread in STOPPING:
        thread.join()


def pytest_sessionfinish(session) -> None:
    stops_done()


def exchange(data: Path) -> Path:
    """The directory a stack's tasks can reach (the rest of the host's temporary directories they cannot)."""
    return data / "exchange"


@pytest.fixture
def shared_dir(stack, request) -> Path:
    """A directory of the stack's exchange for one test: its jobs can read and write files there."""
    path = exchange(stack.settings.data_dir) / re.sub(r"[^A-Za-z0-9-]+", "-", request.node.name)[-60:]
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


# The session's stack while it runs ("stack"), and the dispatch rank of the last test that uses it ("last").
SESSION_STACK: dict[str, Any] = {}


@pytest.fixture(scope="session")
def stack(tmp_path_factory, servers) -> Stack:
    stack = start_stack(tmp_path_factory.mktemp("stack"), cluster=CLUSTER, servers=servers)
    SESSION_STACK["stack"] = stack
    yield stack
    if SESSION_STACK.pop("stack", None) is not None:
        stack.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Once this process's next test comes after every test that uses the session's stack (the unit and service
    tiers run last), the stack stops in a thread of its own: it idled there until the session's end (about 0.09 s
    of CPU a second, three minutes on each worker) and then held the end for its teardown."""
    yield
    stack = SESSION_STACK.get("stack")
    done = nextitem is not None and _dispatch_rank(nextitem)[0] > SESSION_STACK.get("last", 1e9)
    if stack is not None and done and runs_in_dispatch_order(item.config):
        del SESSION_STACK["stack"]
        stop_later(stack)


def runs_in_dispatch_order(config) -> bool:
    """Whether this process runs its tests in the order `pytest_collection_modifyitems` sorted them: one process,
    or a pytest-xdist worker told `--no-loadscope-reorder` (with reordering, `--dist loadgroup` hands out the
    largest groups first, and a test using the stack could follow a unit test)."""
    return getattr(config, "workerinput", None) is None or not config.getoption("loadscopereorder", True)


def wait_until_ready(stack: Stack, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    last = None
    # one client for every look: each new one loads the CA bundle (~40 ms of CPU), and a look was two of them
    with httpx.Client(base_url=stack.api_url, timeout=5) as client:
        while time.monotonic() < deadline:
            try:
                health = client.get("/healthz")
                nodes = client.get("/v2/nodes", headers=headers)
                if health.status_code == 200 and nodes.status_code == 200:
                    items = nodes.json()["items"]
                    static = set(stack.node_ids())
                    if static <= {i["node_id"] for i in items if i["state"] != "lost" and i.get("kind")}:
                        return
                last = (health.text, nodes.text)
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.3)
    raise TimeoutError(f"stack not ready: {last}")


def dump_logs(stack: Stack) -> None:
    for log in sorted((stack.data_dir / "logs").glob("*.log")):
        print(f"===== {log.name}\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def admin_client(stack: Stack, *, timeout: float = 30) -> httpx.AsyncClient:
    """A client of `stack`'s API with the admin token (open it with `async with`)."""
    return httpx.AsyncClient(
        base_url=stack.api_url, timeout=timeout, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )


@pytest_asyncio.fixture(scope="session")
async def api(stack):
    async with admin_client(stack) as client:
        yield client


class StatusLog:
    """Every JobStatusChanged seen on the bus during the session, per job."""

    def __init__(self) -> None:
        self.phases: dict[str, list[tuple[str, str]]] = defaultdict(list)

    async def handler(self, msg) -> None:
        event = json.loads(msg.data)
        self.phases[event["job_id"]].append((event["phase"], event["secondary_phase"]))


@pytest_asyncio.fixture(scope="session")
async def status_log(stack):
    log = StatusLog()
    client = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    await client.subscribe("tm.job.status.*.*", cb=log.handler)
    yield log
    await client.close()


@pytest.fixture
def project(request) -> str:
    """A project of its own for each test."""
    return "p-" + re.sub(r"[^A-Za-z0-9-]+", "-", request.node.name)[-50:].strip("-")


async def eventually(check, *, timeout_s: float = 30, interval_s: float = 0.2):
    """Await `check()` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise AssertionError(f"not true after {timeout_s}s; last value: {value!r}")


def logs_of(stack: Stack) -> Path:
    return stack.data_dir / "logs"
