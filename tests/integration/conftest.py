"""Fixtures of the integration tier: real servers shared by the tests of one module."""

import pytest
import pytest_asyncio

from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port
from tests.integration.servers import real_servers, revoking_what_it_mints
from tests.integration.test_bus_security import CLUSTER


@pytest.fixture(scope="module")
def bus_and_database(tmp_path_factory):
    """A stack's NATS server and database server, nothing else."""
    data = tmp_path_factory.mktemp("servers")
    stack = Stack(StackSettings(data_dir=data, nats_port=free_port(), mongo_url=None, nats_url=None))
    stack.start_nats()
    stack.prepare_bus()  # the streams and consumers, as the operator declares them
    stack.start_database()
    yield stack
    stack.stop_all()


@pytest.fixture(scope="module")
def bus(tmp_path_factory):
    """A NATS server alone (JetStream, the operator's credentials: `admin_creds()`), for one module's tests."""
    stack = Stack(
        StackSettings(data_dir=tmp_path_factory.mktemp("bus"), nats_port=free_port(), mongo_url=None, nats_url=None)
    )
    stack.start_nats()
    yield stack
    stack.stop_all()


@pytest.fixture(scope="module")
def cluster_servers(tmp_path_factory):
    """NATS with the bus identities of the nodes of test_bus_security's CLUSTER (n1, n2), and the database."""
    with real_servers(tmp_path_factory.mktemp("origin"), cluster=CLUSTER, database=True) as stack:
        yield stack


@pytest_asyncio.fixture
async def minted_revoked(server):
    """The module's `server`, whose minter revokes every rented identity a test minted there when the test ends."""
    async with revoking_what_it_mints(server):
        yield
