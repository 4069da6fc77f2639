"""Declaring the streams at start: a bus that is away (restarting, electing its leaders) is waited for, a refusal is
not (a service restarted the moment NATS went down used to exit and stay down)."""

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError, ServiceUnavailableError

from shared.bus import declare_stream


class Streams:
    """A JetStream manager whose API answers come from a script: an exception to raise, or None for success."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    async def _answer(self, call: str, config: StreamConfig) -> None:
        self.calls.append((call, config.name))
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer

    async def add_stream(self, *, config: StreamConfig) -> None:
        await self._answer("add", config)

    async def update_stream(self, *, config: StreamConfig) -> None:
        await self._answer("update", config)


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
