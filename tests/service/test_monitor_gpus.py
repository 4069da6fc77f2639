"""Each GPU's figures in the monitor: the latest believed reading of a heartbeat is what the node list shows; a
reading past the GPU's recorded memory, or of a GPU not on record, is not; figures alone write nothing."""

from shared.events import GpuReading
from services.monitor.handlers import list_nodes
from tests.service.test_monitor_liveness import beat, fleet_of, heard
from tests.unit.test_liveness import Clock


async def test_each_gpu_s_latest_believed_reading_is_shown_and_written_with_nothing_else(monitor_broker):  # noqa: F811
    broker, monitor, _ = monitor_broker
    nodes = await fleet_of(broker, monitor, Clock(), "n1")  # one GPU of 24 GB
    for n, (util, memory) in enumerate(((10, 5.0), (87, 12.5), (99, 500.0)), start=1):  # the last past its memory
        await heard(
            monitor,
            beat("n1", n).model_copy(
                update={
                    "gpus": (
                        GpuReading(index=0, util_percent=util, memory_used_gb=memory),
                        GpuReading(index=7, util_percent=50, memory_used_gb=1),
                    )
                }
            ),
        )  # a GPU the node's record does not have
        [shown] = (await list_nodes({"limit": 10}, monitor))["items"]
        assert [(g["index"], g["util_percent"]) for g in shown["gpus"]] == ([(0, util)] if memory < 24 else [])
    assert nodes.writes == 1  # figures alone are the clock's kind of change: kept in memory only
