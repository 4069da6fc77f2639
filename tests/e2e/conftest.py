"""Fixtures of the end-to-end tier alone."""
import pytest_asyncio

from tests.conftest import exchange
from tests.e2e.eta_replays import Replays


@pytest_asyncio.fixture(scope="session")
async def mlperf_replays(api, stack):
    """The MLPerf replays of the ETA tests, run side by side (each a minute of real time)."""
    replays = Replays(api, exchange(stack.settings.data_dir))
    yield replays
    replays.cancel()
