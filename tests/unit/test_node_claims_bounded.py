"""What a node sends is bounded where it is read: numbers finite and within what any machine has, texts cut to a
length every reader can store and show, so no claim draws every job to one node, breaks a page, fills the jobs
stream or holds a task for ever (found by review)."""

import collections
import math

import pytest
from pydantic import ValidationError

from shared.events import MAX_EXIT_MESSAGE, LogLine, NodeHeartbeat, StopTask, TaskExited, TaskStarted
from shared.nodes import Gpu, NodeInfo
from services.agent.runner import describe_exit
from tests.factories import T0, exited, started

GPU = {"index": 0, "model": "H100", "memory_gb": 80, "tflops": 989}
NODE = {"node_id": "n1", "kind": "local", "cpu_count": 8, "memory_gb": 64, "gpus": [GPU]}


@pytest.mark.parametrize(
    "change",
    [
        {"memory_gb": math.inf},
        {"memory_gb": math.nan},
        {"memory_gb": 1e6},
        {"tflops": 1e308},
        {"measured_tflops": math.inf},
        {"index": 64},
        {"model": "x" * 129},
    ],
)
def test_a_gpu_no_machine_has_is_refused(change):
    with pytest.raises(ValidationError):
        Gpu(**{**GPU, **change})


@pytest.mark.parametrize(
    "change",
    [
        {"cpu_count": 1e308},
        {"cpu_count": math.inf},
        {"memory_gb": math.inf},
        {"price_per_hour": math.nan},
        {"price_per_hour": 1e7},
        {"gpus": [{**GPU, "index": i % 64} for i in range(65)]},
        {"labels": {f"k{i}": "v" for i in range(65)}},
        {"address": "a" * 254},
    ],
)
def test_a_node_no_machine_is_is_refused(change):
    NodeInfo(**NODE)
    with pytest.raises(ValidationError):
        NodeInfo(**{**NODE, **change})


@pytest.mark.parametrize(
    "change",
    [{"price_per_hour": math.nan}, {"price_per_hour": -1}, {"gpu_count": 10**300}, {"world_size": 0}, {"pid": -5}],
)
def test_a_task_start_with_impossible_numbers_is_refused(change):
    with pytest.raises(ValidationError):
        TaskStarted.model_validate({**started("j").model_dump(), **change})


def test_a_nodes_texts_are_cut_not_refused():
    start = TaskStarted.model_validate(
        {**started("j").model_dump(), "gpu_model": "g" * 10**6, "node_kind": "k" * 10**6, "user_name": "u" * 10**6}
    )
    assert (len(start.gpu_model), len(start.node_kind), len(start.user_name)) == (128, 64, 128)
    end = TaskExited.model_validate({**exited("j").model_dump(), "message": "\x01" * 7 * 2**20})
    assert len(end.message) == MAX_EXIT_MESSAGE


def test_times_and_graces_are_finite():
    with pytest.raises(ValidationError):
        LogLine(t=math.nan, line="x")
    with pytest.raises(ValidationError):
        LogLine(t=1e308, line="x")
    assert LogLine(t=T0.timestamp(), line="x").t == T0.timestamp()
    with pytest.raises(ValidationError):
        StopTask(event_id="s", node_id="n1", job_id="j", attempt=1, grace_s=math.inf)
    with pytest.raises(ValidationError):
        NodeHeartbeat(event_id="h", node_id="n1", boot_id="b", gpu_utilization=math.nan)


def test_a_tasks_end_says_its_last_lines_within_a_bus_message_whatever_it_printed():
    tail = collections.deque(["x" * 2**20] * 19 + ["Traceback: the last line"], maxlen=20)
    message = describe_exit(1, tail)
    assert len(message) <= MAX_EXIT_MESSAGE and message.startswith("exited with code 1; last output:\n")
    assert message.endswith("Traceback: the last line") and " …" in message


@pytest.mark.parametrize("address", ["::1", "fe80::1%eth0", "my_host", "2001:db8::1", "10.0.0.1", "gpu-7.lab.example"])
def test_every_address_a_node_may_be_reached_at_is_taken(address):
    """`::1`, a zone id, an underscore: what a cluster file or the route to the bus gives (a first pattern refused
    them, and the agent could not start; found by review)."""
    assert NodeInfo(**{**NODE, "address": address}).address == address


@pytest.mark.parametrize("address", ["a b", "x\ny", "$(id)", "http://x", "fe80::1%e th", "-rf"])
def test_text_that_is_no_address_is_refused(address):
    with pytest.raises(ValidationError):
        NodeInfo(**{**NODE, "address": address})
