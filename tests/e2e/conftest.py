"""Fixtures of the end-to-end tier alone."""

import pytest
import pytest_asyncio

from tests.conftest import admin_client, start_stack, stop_later, wait_until_ready
from tests.e2e.watches import Watches


@pytest.fixture(autouse=True)
def whole_stack(request):
    """Each test on the session's stack starts with every process of it running: one an earlier test killed and
    left dead (a test that failed before it restarted it) is started again first, so one failure stays one."""
    if "stack" in request.fixturenames:
        stack = request.getfixturevalue("stack")
        if stack.restart_dead({}):
            wait_until_ready(stack)
    yield


@pytest.fixture(scope="session")
def watches(stack, request):
    """Every job the session's ETA tests watch (`@pytest.mark.watched`), started side by side in a thread of their
    own the first time a test asks for them (tests/e2e/watches.py)."""
    names = sorted({m.args[0] for item in request.session.items for m in item.iter_markers("watched")})
    running = Watches(stack, names)
    yield running
    running.cancel()


# The placement-rules and renting tests' fleet: one local node, one reserved node, and rentable instances that
# boot in a second (each module gets a stack of its own).
FLEET = """
[[nodes]]
id = "lab-1"
kind = "local"
cpu_count = 8
memory_gb = 32
price_per_hour = 0.5
gpus = [{ model = "L4", memory_gb = 24, tflops = 125, count = 1 }]

[[nodes]]
id = "res-1"
kind = "reserved"
cpu_count = 8
memory_gb = 32
price_per_hour = 1.2
gpus = [{ model = "A10", memory_gb = 24, tflops = 125, count = 1 }]

[[instance_types]]
name = "g.small"
gpus = 1
gpu_model = "A10G"
gpu_memory_gb = 24
tflops = 125
cpu = 8
memory_gb = 32
price_per_hour = 2.0
startup_delay_s = 1
"""
TUNING = {
    "TRAINMASTER_IDLE_RELEASE_S": "2",
    "TRAINMASTER_PULLBACK_MIN_REMAINING_S": "5",
    "TRAINMASTER_MIGRATION_S": "10",
    "TRAINMASTER_SCHEDULE_TICK_S": "1",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, servers):
    stack = start_stack(tmp_path_factory.mktemp("rules"), cluster=FLEET, servers=servers, extra_env=TUNING)
    yield stack
    stop_later(stack)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(fleet):
    async with admin_client(fleet) as api:
        yield api
