"""A question no one listens to yet is asked again while its time lasts, by every service that asks another: a first
question after a start used to be refused (a job not admitted, an estimate missing, a command sent the slow way)."""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import NoRespondersError

from shared import asking
from shared.bus import RPC_ADMIT, RPC_PREDICT, RPC_TERMINATE
from shared.events import JobTerminateRequested
from shared.jobs import Phase, SecondaryPhase
from shared.rpc import AdmitQuery, PredictQuery
from services.placement.estimates import Estimates
from services.placement.fleet import Fleet
from services.submitter.commands import send_command
from tests.factories import status_changed, unique


@dataclass
class LateBroker:
    """Answers `answer` once `away` questions found no one listening; never publishes."""

    answer: Any
    away: int = 1
    asked: list[str] = field(default_factory=list)

    async def request(self, payload: Any, subject: str, timeout: float = 0) -> Any:
        self.asked.append(subject)
        if len(self.asked) <= self.away:
            raise NoRespondersError
        return SimpleNamespace(decode=lambda: _value(self.answer))

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("published: the answer was not waited for")


async def _value(value: Any) -> Any:
    return value


async def test_a_question_is_asked_again_while_no_one_listens_and_answered():
    calls: list[float] = []

    async def send(left: float) -> str:
        calls.append(left)
        if len(calls) < 4:
            raise NoRespondersError
        return "answer"

    assert await asking.ask(send, timeout=2) == "answer"
    assert len(calls) == 4 and all(0 < left <= 2 for left in calls) and calls == sorted(calls, reverse=True)


async def test_no_one_listening_past_the_timeout_raises_and_other_errors_at_once():
    async def never(left: float) -> None:
        raise NoRespondersError

    with pytest.raises(NoRespondersError):
        await asking.ask(never, timeout=0.1)
    tries: list[float] = []

    async def times_out(left: float) -> None:
        tries.append(left)
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await asking.ask(times_out, timeout=2)
    assert len(tries) == 1


async def test_placement_s_first_admission_question_waits_for_billing_to_listen():
    broker = LateBroker({"allowed": True})
    fleet = Fleet(store=SimpleNamespace(broker=broker), provider=None)  # type: ignore[arg-type]
    query = AdmitQuery(project_id="p", user_name="u", purpose="provision", gpus=1)
    reply = await fleet._admit(query)
    assert reply.allowed, reply.reason
    assert broker.asked == [RPC_ADMIT, RPC_ADMIT]


async def test_placement_s_first_estimate_waits_for_the_estimator_to_listen():
    broker = LateBroker({"duration_s": 3600.0, "model_version": 1})
    estimate = await Estimates(broker=broker)._ask(PredictQuery(benchmark="bert"))
    assert estimate is not None and estimate.duration_s == 3600.0
    assert broker.asked == [RPC_PREDICT, RPC_PREDICT]


async def test_a_terminate_asked_while_the_monitor_does_not_listen_yet_is_answered_not_sent_the_slow_way():
    job_id = unique("job")
    status = status_changed(job_id, Phase.TERMINATED, SecondaryPhase.TERMINATED)
    broker, applied = LateBroker(status.model_dump(mode="json")), []

    async def apply_status(event):
        applied.append(event.phase)

    command = JobTerminateRequested(event_id=unique("term"), job_id=job_id, requested_by="alice")
    await send_command(broker, SimpleNamespace(apply_status=apply_status), command, RPC_TERMINATE)  # type: ignore[arg-type]
    assert broker.asked == [RPC_TERMINATE, RPC_TERMINATE] and applied == [Phase.TERMINATED]


async def test_a_terminate_of_a_job_the_monitor_has_not_read_yet_is_also_left_on_the_stream():
    """An empty answer: the monitor keeps it for the job's submission, and the durable command, after the
    submission in the job's order, reaches whichever monitor reads the job (found by review)."""
    published = []

    @dataclass(eq=False)
    class Recording(LateBroker):
        __hash__ = object.__hash__  # the publish keys its dedup ids by broker

        async def publish(self, *args: Any, **kwargs: Any) -> None:
            published.append(kwargs.get("subject") or args[1:2])

    broker = Recording(None)
    command = JobTerminateRequested(event_id=unique("term"), job_id=unique("job"), requested_by="alice")
    await send_command(broker, SimpleNamespace(), command, RPC_TERMINATE)  # type: ignore[arg-type]
    assert broker.asked == [RPC_TERMINATE, RPC_TERMINATE] and len(published) == 1
