"""A rented node's command consumer is there when its agent starts, however long placement lets the node boot."""

import nats
import pytest

from shared.bus import RENTED_CONSUMER_INACTIVE_S
from services.placement.fleet import REGISTER_PATIENCE_S
from services.placement.policy import InstanceType
from services.placement.providers import NodeCredentials
from services.placement.providers.bootstrap import NodeBoot
from services.placement.providers.cloud import NodeMaker
from tests.factories import L4_ENTRY, unique
from tests.integration.servers import real_servers, running_minter
from tests.integration.test_consumer_filters import CLUSTER

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("minted_revoked")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("rented"), cluster=CLUSTER) as stack:
        yield stack


async def test_a_node_that_may_take_longer_than_the_expiry_to_boot_keeps_its_consumer_until_it_may_start(
    server, tmp_path
):
    """The consumer was made with a one-hour expiry counted from its creation: a Pod pending for GPUs longer than
    that (placement waits its type's start-up delay and the registration patience) found no consumer to read, and
    its agent, which may not make one, could never read its commands."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    maker = NodeMaker(boot=NodeBoot(), folder=tmp_path / "nodes", credentials=credentials)
    node_id, slow = unique("od"), InstanceType(**L4_ENTRY, startup_delay_s=2 * RENTED_CONSUMER_INACTIVE_S)
    async with running_minter(server):
        await maker.bundle(node_id, slow, root="/var/lib/trainmaster", spot=False)
    operator = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))
    try:
        info = await operator.jetstream(timeout=2).consumer_info("TM_NODE_CMD", f"agent-{node_id}")
    finally:
        await operator.close()
    waited = slow.startup_delay_s + REGISTER_PATIENCE_S  # after this placement gives the node back
    assert info.config.inactive_threshold == waited + RENTED_CONSUMER_INACTIVE_S
    async with running_minter(server):
        await maker.forget(node_id)
