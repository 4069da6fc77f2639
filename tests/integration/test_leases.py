"""Leader leases on a real NATS server: one replica leads, the other takes over when it stops renewing."""

import asyncio
import time

import nats
import pytest
import pytest_asyncio

from shared.bus import LEASE_TTL_S, LEASES
from shared.lease import Lease, LeaseLost
from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port

pytestmark = pytest.mark.integration
RENEW_S = 0.3  # renewals more often than a service's (shared.lease.RENEW_S): the tests count renewals, not seconds
# The takeover waits out a lease's time to live by design; on this module's own server it need not be the stack's
# LEASE_TTL_S (9 s more of waiting): the bucket forgets a value, and the lease counts itself held, for this long.
SHORT_TTL_S = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    stack = Stack(
        StackSettings(data_dir=tmp_path_factory.mktemp("leases"), nats_port=free_port(), mongo_url=None, nats_url=None)
    )
    stack.start_nats()
    stack.prepare_bus()
    yield stack
    stack.stop_all()


@pytest_asyncio.fixture
async def short_lived_leases(server):
    """The module's lease bucket forgetting a value SHORT_TTL_S after it was written, for one test: the server, not
    the lease, makes a dead leader's lease run out, so a lease's `ttl_s` alone would change no takeover."""
    admin = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))
    js = admin.jetstream()

    async def bucket_ttl(seconds: float) -> None:
        config = (await js.stream_info(LEASES.name)).config
        await js.update_stream(config=config.evolve(max_age=seconds))

    try:
        await bucket_ttl(SHORT_TTL_S)
        yield
    finally:
        await bucket_ttl(LEASE_TTL_S)  # as prepare_bus declared it, for the tests after this one
        await admin.close()


async def client(server, identity: str, errors: list | None = None):
    async def error(exc: Exception) -> None:
        if errors is not None:
            errors.append(exc)

    return await nats.connect(
        server.nats_url,
        user_credentials=str(server.identities.creds(identity)),
        inbox_prefix=f"_INBOX_{identity}",
        error_cb=error,
    )


async def test_one_replica_leads_and_the_other_takes_over_once_the_leader_stops_renewing(server, short_lived_leases):
    first_nc, second_nc = await client(server, "placement"), await client(server, "placement")
    first = Lease(first_nc.jetstream(), "placement", ttl_s=SHORT_TTL_S, renew_s=RENEW_S)
    second = Lease(second_nc.jetstream(), "placement", ttl_s=SHORT_TTL_S, renew_s=RENEW_S)
    try:
        epoch = await asyncio.wait_for(first.acquire(), timeout=LEASE_TTL_S + 5)  # a previous test's may linger
        assert first.held() and epoch > 0
        keeping = asyncio.create_task(first.keep())
        waiting = asyncio.create_task(second.acquire(poll_s=0.2))
        await asyncio.sleep(3 * first.renew_s)
        assert not waiting.done() and first.held()  # renewed: nobody else may take it
        keeping.cancel()  # the leader dies: no more renewals
        stopped = time.monotonic()
        new_epoch = await asyncio.wait_for(waiting, timeout=SHORT_TTL_S + 3)
        took = time.monotonic() - stopped
        assert new_epoch > epoch and second.held()
        assert first.margin_s <= took <= SHORT_TTL_S + 1  # not before the old lease could have run out
        assert not first.held()  # the old leader's own clock told it to stop before the other took over
        with pytest.raises(LeaseLost, match="taken by another|not renewed"):
            await first.keep()  # it would come back to a lease that is no longer its own
    finally:
        await first_nc.close()
        await second_nc.close()


async def test_a_service_may_take_only_its_own_lease(server):
    errors: list[Exception] = []
    nc = await client(server, "billing", errors)
    try:
        with pytest.raises((nats.errors.Error, asyncio.TimeoutError)):
            await Lease(nc.jetstream(), "placement")._write(last=0, timeout_s=2)
        assert any("permissions violation" in str(e).lower() and "tm_leaders.placement" in str(e) for e in errors)
        own = Lease(nc.jetstream(), "billing")
        assert await asyncio.wait_for(own.acquire(), timeout=LEASE_TTL_S + 5) > 0
    finally:
        await nc.close()


async def test_the_lease_bucket_forgets_a_value_after_its_time_to_live(server):
    admin = await nats.connect(server.nats_url, user_credentials=str(server.admin_creds()))
    try:
        info = await admin.jetstream().stream_info(LEASES.name)
        assert info.config.max_age == LEASE_TTL_S and info.config.max_msgs_per_subject == 1
    finally:
        await admin.close()


async def test_a_write_whose_acknowledgement_was_lost_does_not_cost_the_lease(server):
    nc = await client(server, "estimator")
    try:
        lease = Lease(nc.jetstream(), "estimator", renew_s=RENEW_S)
        epoch = await asyncio.wait_for(lease.acquire(), timeout=LEASE_TTL_S + 5)
        lost_ack = await lease._write(last=lease.revision, timeout_s=2)  # the server took it; we never saw the ack
        assert lost_ack > lease.revision
        keeping = asyncio.create_task(lease.keep())
        await asyncio.sleep(2.5 * lease.renew_s)  # renewals on the stale revision find the key rewritten: by us
        assert not keeping.done() and lease.held() and lease.revision > lost_ack and lease.epoch == epoch
        keeping.cancel()
        other = Lease(nc.jetstream(), "estimator", holder="elsewhere:1")  # another replica's view: not its own
        assert await other._own_last_write() is None
    finally:
        await nc.close()


async def test_an_agent_aiming_jetstream_answers_at_the_lease_does_not_unseat_the_leader(server):
    """The JetStream API answers whatever reply subject a request names, writing into the lease's key."""
    nc, agent = await client(server, "monitor"), await client(server, "agent-n1")
    try:
        lease = Lease(nc.jetstream(), "monitor", renew_s=RENEW_S)
        epoch = await asyncio.wait_for(lease.acquire(), timeout=LEASE_TTL_S + 5)
        keeping = asyncio.create_task(lease.keep())
        for _ in range(3):
            await agent.publish("$JS.API.CONSUMER.INFO.TM_NODE_CMD.agent-n1", b"", reply=lease.subject)
            await agent.flush()
            await asyncio.sleep(1.5 * lease.renew_s)
        assert not keeping.done() and lease.held() and lease.epoch == epoch
        await asyncio.sleep(1.5 * lease.renew_s)
        keeping.cancel()
        assert await lease._own_last_write() == lease.revision  # the lease is in the key again, not the stray
    finally:
        await nc.close()
        await agent.close()
