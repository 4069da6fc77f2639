"""A node's word on which run of its agent speaks is bounded like every other claim it makes."""

import pytest
from pydantic import ValidationError

from shared.events import NodeHeartbeat, NodeRegistered, NodeTasksLost, TaskStarted
from shared.nodes import NodeInfo
from tests.factories import started


def test_an_agents_own_boot_id_is_taken_and_one_past_64_characters_is_refused_wherever_it_is_said():
    node = NodeInfo(node_id="n1", kind="local", cpu_count=4, memory_gb=16, gpus=[])
    run = "0123456789abcdef0123456789abcdef"  # what an agent sends: uuid4().hex
    NodeRegistered(event_id="r", node=node, boot_id=run)
    NodeHeartbeat(event_id="h", node_id="n1", boot_id=run)
    long = "x" * 65
    refusals = [
        lambda: NodeRegistered(event_id="r", node=node, boot_id=long),
        lambda: NodeHeartbeat(event_id="h", node_id="n1", boot_id=long),
        lambda: TaskStarted.model_validate({**started("j").model_dump(), "boot_id": long}),
        lambda: NodeTasksLost(event_id="l", node_id="n1", cause="restarted", boot_id=long),
    ]
    for refused in refusals:
        with pytest.raises(ValidationError, match="boot_id"):
            refused()
