"""Declaring the streams at start: a bus that is away (restarting, electing its leaders) is waited for, a refusal is
not (a service restarted the moment NATS went down used to exit and stay down)."""

from types import SimpleNamespace

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError, ServiceUnavailableError

from shared.bus import Shrinking, declare_stream, shrunk_limits


class Streams:
    """A JetStream manager whose API answers come from a script: an exception to raise, or None for success."""

    def __init__(self, *answers, existing: StreamConfig | None = None):
        self.answers, self.calls = list(answers), []
        self.existing = existing or CONFIG

    async def _answer(self, call: str, config: StreamConfig) -> None:
        self.calls.append((call, config.name))
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer

    async def add_stream(self, *, config: StreamConfig) -> None:
        await self._answer("add", config)

    async def update_stream(self, *, config: StreamConfig) -> None:
        await self._answer("update", config)

    async def stream_info(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(config=self.existing)


CONFIG = StreamConfig(name="JOBS", subjects=["tm.job.>"])


async def test_a_bus_that_is_away_is_waited_for():
    streams = Streams(ServiceUnavailableError(), NatsTimeoutError(), None)
    await declare_stream(streams, CONFIG, patience_s=10)  # type: ignore[arg-type]
    assert streams.calls == [("add", "JOBS")] * 3


async def test_an_existing_stream_is_updated_and_its_update_retried_while_the_bus_is_away():
    streams = Streams(BadRequestError(), ServiceUnavailableError(), BadRequestError(), None)
    await declare_stream(streams, CONFIG, patience_s=10)  # type: ignore[arg-type]
    assert streams.calls == [("add", "JOBS"), ("update", "JOBS"), ("add", "JOBS"), ("update", "JOBS")]


async def test_a_bus_away_past_the_patience_is_an_error():
    streams = Streams(*[NatsTimeoutError()] * 50)
    with pytest.raises(NatsTimeoutError):
        await declare_stream(streams, CONFIG, patience_s=0.5)  # type: ignore[arg-type]
    assert 1 < len(streams.calls) < 10


async def test_a_refusal_is_raised_at_once():
    streams = Streams(BadRequestError(), BadRequestError(description="subjects overlap"))
    with pytest.raises(BadRequestError):
        await declare_stream(streams, CONFIG, patience_s=10)  # type: ignore[arg-type]
    assert len(streams.calls) == 2


LOGS = StreamConfig(name="TM_LOGS", subjects=["tm.log.>"], max_bytes=16 * 1024**3, num_replicas=3)


async def test_a_declaration_that_would_shrink_a_stream_is_refused_naming_the_setting_and_changes_nothing():
    """The server trims a stream to its new limit at once: an operator's 16 GiB of output were cut to the default 4
    GiB by the first declaration that did not carry the setting."""
    streams = Streams(BadRequestError(), existing=LOGS)
    with pytest.raises(Shrinking, match=r"max_bytes=17179869184.*4294967296 \(TRAINMASTER_LOG_STREAM_MAX_BYTES"):
        await declare_stream(streams, LOGS.evolve(max_bytes=4 * 1024**3), patience_s=10)  # type: ignore[arg-type]
    assert streams.calls == [("add", "TM_LOGS")]
    asked = Streams(BadRequestError(), existing=LOGS)
    await declare_stream(asked, LOGS.evolve(num_replicas=1), patience_s=10, shrink=True)  # type: ignore[arg-type]
    assert asked.calls == [("add", "TM_LOGS"), ("update", "TM_LOGS")]


@pytest.mark.parametrize(
    "existing, wanted, shrunk",
    [
        (LOGS, LOGS, []),
        (LOGS, LOGS.evolve(max_bytes=32 * 1024**3, num_replicas=5), []),
        (LOGS, LOGS.evolve(max_bytes=-1), []),  # no limit: keeps more
        (LOGS.evolve(max_bytes=-1), LOGS, ["max_bytes"]),
        (LOGS, LOGS.evolve(num_replicas=1), ["num_replicas"]),
        (LOGS.evolve(num_replicas=None), LOGS.evolve(num_replicas=1), []),
    ],
)
def test_what_a_declaration_would_shrink(existing, wanted, shrunk):
    assert [line.split("=")[0].split()[-1] for line in shrunk_limits(existing, wanted)] == shrunk
