"""The profile of a stack's processes: each py-spy sample put down to what it did and what it ran for."""

from collections import Counter

from bench.cpuprofile import kind_of, per_job, purpose_of, subject_kind, summarize

LOOP = ("<module> (services/monitor/__main__.py:5)", "run (shared/service.py:1)", "Handle._run (asyncio/events.py:80)")
HANDLER = (
    *LOOP,
    "TaskHandle._run_coro (faststream/_internal/utils/functions.py:50)",
    "wrapper (shared/keyed.py:190)",
    "on_job_event (services/monitor/handlers.py:181)",
    "Monitor.apply (services/monitor/service.py:155)",
)


def test_a_sample_is_put_down_to_its_innermost_known_library_and_the_handler_it_ran_for():
    send = "_SelectorSocketTransport.write (asyncio/selector_events.py:1057)"
    sent = (*HANDLER, "_write (shared/store.py:412)", send)
    assert kind_of(list(sent)) == "socket sends and receives"
    assert purpose_of(list(sent)) == "monitor/handlers.py:on_job_event"
    validated = (*HANDLER, "BaseModel.model_validate (pydantic/main.py:792)")
    assert kind_of(list(validated)) == "pydantic validation and encoding"
    flusher = (*LOOP, "Client._flusher (nats/aio/client.py:2363)", "writelines (asyncio/transports.py:122)")
    assert purpose_of(list(flusher)) == "library: Client._flusher"
    assert kind_of([*LOOP, "EpollSelector.select (selectors.py:468)"]) == "waiting"


def test_waits_are_left_out_of_the_cpu_shares():
    samples = Counter(
        {
            (*HANDLER, "BaseModel.model_validate (pydantic/main.py:792)"): 30,
            (*HANDLER, "Monitor.apply (services/monitor/service.py:156)"): 10,
            (*LOOP, "_run_once (asyncio/base_events.py:1922)", "EpollSelector.select (selectors.py:468)"): 60,
        }
    )
    figures = summarize(samples, cpu_s=4.0, jobs=100)
    assert figures["cpu_ms_per_job"] == 40.0 and figures["waits"] == 0.6
    assert figures["by_kind"] == {"pydantic validation and encoding": 30.0, "project code": 10.0}


def test_bus_counts_per_job_blank_node_and_job_tokens():
    assert subject_kind("tm.job.task.n1.started") == "tm.job.task.*.started"
    assert subject_kind("tm.log.n1.job-7") == "tm.log.*.*" and subject_kind("tm.eta.job-7") == "tm.eta.*"
    assert subject_kind("tm.job.status") == "tm.job.status"
    before = {"published": Counter({"tm.job.status": 4}), "delivered": Counter({"monitor-jobs": 2})}
    after = {"published": Counter({"tm.job.status": 44}), "delivered": Counter({"monitor-jobs": 42})}
    assert per_job(before, after, jobs=10) == {"published": {"tm.job.status": 4.0}, "delivered": {"monitor-jobs": 4.0}}
