"""The monitor's heartbeat intake reads a node's heartbeats no faster than a quarter of the cadence and none too
large: one agent flooding its heartbeat subject kept the intake's queue from emptying (no node was then ever found
lost) and each changed boot id was a node loss (found by review)."""

from types import SimpleNamespace

from shared.events import NodeHeartbeat, TaskRef
from services.monitor import handlers


class Heard:
    def __init__(self) -> None:
        self.cadence = SimpleNamespace(interval_s=2.0)
        self.beats: list[NodeHeartbeat] = []

    async def heartbeat(self, event: NodeHeartbeat) -> None:
        self.beats.append(event)


def message(node_id: str, boot_id: str, **fields) -> SimpleNamespace:
    beat = NodeHeartbeat(event_id=f"{node_id}:{boot_id}", node_id=node_id, boot_id=boot_id, **fields)
    return SimpleNamespace(subject=beat.subject, data=beat.model_dump_json().encode())


async def test_a_node_beating_faster_than_its_cadence_is_read_at_the_cadence_and_others_as_they_come(monkeypatch):
    heard, now = Heard(), [100.0]
    monkeypatch.setattr(handlers, "EVENT_HANDLERS", {NodeHeartbeat: type(heard).heartbeat})
    intake = handlers.heartbeat_intake(heard, clock=lambda: now[0])  # type: ignore[arg-type]
    for n in range(640):  # 64 a second for 10 s, a new boot id each time: each read one a node loss
        await intake(message("n1", f"boot-{n}"))
        if n % 64 == 0:
            await intake(message("n2", "steady"))  # at its cadence's second: every one read
        now[0] += 1 / 64
    assert [b.boot_id for b in heard.beats if b.node_id == "n1"] == [f"boot-{n}" for n in range(0, 640, 32)]
    assert sum(b.node_id == "n2" for b in heard.beats) == 10
    big = SimpleNamespace(subject="tm.node.evt.n3.heartbeat", data=b"{" + b" " * (handlers.MAX_HEARTBEAT_BYTES + 1))
    await intake(big)
    assert not [b for b in heard.beats if b.node_id == "n3"]


def test_a_heartbeat_lists_each_task_once_and_a_bounded_number_of_them():
    ref = TaskRef(job_id="j", attempt=1, rank=0)
    beat = NodeHeartbeat(event_id="b", node_id="n1", boot_id="x", running=(ref,) * 1000)
    assert beat.running == (ref,)
    try:
        NodeHeartbeat(
            event_id="b",
            node_id="n1",
            boot_id="x",
            running=[TaskRef(job_id="j", attempt=1, rank=r) for r in range(1025)],
        )
    except ValueError:
        pass
    else:
        raise AssertionError("1,025 tasks taken")
