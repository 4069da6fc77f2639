"""A stop or a shutdown that meets a task still preparing: its end is reported, once, whenever the stop came."""

import asyncio

import pytest

from shared.events import StopTask, TaskStarted
from services.agent.journal import Journal
from tests.factories import start_task, unique
from tests.unit.test_agent_fence import Bus, Clock, make_agent, until


@pytest.mark.parametrize("how", ["stop", "twice", "shutdown"])
async def test_a_launch_stopped_before_its_first_step_reports_its_end_and_is_forgotten(tmp_path, how):
    """The start and the stop come in one batch from the command consumer: the launch is cancelled before it ran
    a step, so its own end report never runs (it stayed in `launching` for ever, and its job waited on it)."""
    bus = Bus()
    agent = make_agent(tmp_path, bus, Clock())
    job_id = unique("j")
    stop = StopTask(event_id=f"{job_id}:stop", node_id="n1", job_id=job_id, attempt=1, grace_s=1)
    await agent.start(start_task(job_id))  # no await between: the launch has not run
    if how == "shutdown":
        await agent.shutdown()
    else:
        await agent.stop(stop)
        if how == "twice":  # redelivered: a second cancel must not cut the first one's report short
            await agent.stop(stop)
    await until(lambda: bus.exits(), "the stopped launch's end")
    await asyncio.sleep(0.1)
    [exited] = bus.exits()
    assert exited.job_id == job_id and exited.reason == "terminated"
    assert Journal.key(job_id, 1, 0) not in agent.launching
    assert not any(isinstance(m, TaskStarted) for m in bus.sent)
