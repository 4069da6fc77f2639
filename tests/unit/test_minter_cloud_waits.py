"""The minter and a cloud that is slow, behind, or stopping a machine (rev10): a machine launched a moment ago is
asked about again before its node is refused; a slow cloud holds no other request; a revocation whose push failed is
pushed again; a machine being stopped keeps its agent's identity until it is gone."""

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from shared.buscreds import Minter, write_secret
from shared.minting import MINT_CONSUMER_MAKER, REVOKE_NODE
from services.minter.app import MinterProcess, MinterSettings
from services.minter.rules import Refused
from tests.unit.test_bus_roles import minter
from tests.unit.test_minter_clouds import rent

EC2 = frozenset({"ec2"})


@dataclass
class FakeCloud:
    """Lists `running` (and `stopping` when asked for those too), each carried by `machines[node]` (default one,
    `i-<node>`); a node in `late` only from its `late[node]`-th ask on; `gate`, when set, holds every ask until it
    is opened (a slow cloud)."""

    running: set[str] = field(default_factory=set)
    stopping: set[str] = field(default_factory=set)
    late: dict[str, int] = field(default_factory=dict)
    gate: threading.Event | None = None
    machines: dict[str, set[str]] = field(default_factory=dict)  # the ids of the machines carrying a node listed
    asks: int = 0
    name, machine, where = "ec2", "instance", "a fake EC2"

    def launched(self, node_ids=None, *, stopping: bool = False) -> dict[str, set[str]]:
        self.asks += 1
        if self.gate is not None:
            self.gate.wait(10)
        listed = self.running | (self.stopping if stopping else set())
        listed |= {n for n, from_ask in self.late.items() if self.asks >= from_ask}
        return {n: self.machines.get(n, {f"i-{n}"}) for n in listed if node_ids is None or n in node_ids}


@dataclass
class Pushes:
    """The account updates sent (`fail` first ones refused)."""

    fail: int = 0
    sent: list[str] = field(default_factory=list)

    async def __call__(self, minter: Minter, account: str) -> None:
        if self.fail:
            self.fail -= 1
            raise TimeoutError("the bus servers are restarting")
        self.sent.append(account)


def process_with(tmp_path, cloud: FakeCloud, *nodes: str, patience_s: float = 5) -> tuple[MinterProcess, Pushes]:
    m = minter()
    for node_id in nodes:
        rent(m, node_id, "ec2", providers=EC2)
    write_secret(tmp_path / "minter.json", m.to_json())
    (tmp_path / "cluster.toml").write_text("")
    settings = MinterSettings(
        minter_file=tmp_path / "minter.json",
        cluster_file=tmp_path / "cluster.toml",
        launch_grace_s=0,
        launch_patience_s=patience_s,
    )
    process = MinterProcess(settings)
    process.clouds, process.limits.providers = {"ec2": cloud}, EC2
    pushes = Pushes()
    process.update_account = pushes  # type: ignore[method-assign]
    return process, pushes


async def test_a_machine_the_cloud_lists_a_moment_late_gets_its_consumer_maker(tmp_path):
    """EC2's Describe calls may not show an instance just launched: one miss refused the rental (its id retired, a
    revocation spent)."""
    cloud = FakeCloud(late={"od-1": 3})
    process, _ = process_with(tmp_path, cloud, "od-1")
    answer = await process.handle(MINT_CONSUMER_MAKER, b'{"node_id": "od-1"}')
    assert answer.creds and cloud.asks == 3


async def test_a_machine_never_listed_is_refused_once_the_patience_is_spent(tmp_path):
    cloud = FakeCloud()
    process, _ = process_with(tmp_path, cloud, "od-1", patience_s=0.6)
    with pytest.raises(Refused, match="no pending or running instance"):
        await process.handle(MINT_CONSUMER_MAKER, b'{"node_id": "od-1"}')
    assert cloud.asks == 2


async def test_a_slow_cloud_holds_no_other_request_and_a_node_revoked_meanwhile_gets_no_consumer_maker(tmp_path):
    cloud = FakeCloud(running={"od-1"}, gate=threading.Event())
    process, pushes = process_with(tmp_path, cloud, "od-1", "od-2")
    asking = asyncio.create_task(process.handle(MINT_CONSUMER_MAKER, b'{"node_id": "od-1"}'))
    while not cloud.asks:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(process.handle(REVOKE_NODE, b'{"node_id": "od-2"}'), 2)  # not behind the cloud
    await asyncio.wait_for(process.handle(REVOKE_NODE, b'{"node_id": "od-1"}'), 2)
    cloud.gate.set()  # type: ignore[union-attr]
    with pytest.raises(Refused, match="od-1 has no live agent identity"):
        await asking
    assert len(pushes.sent) == 2


async def test_a_sweeps_revocation_whose_push_failed_is_pushed_at_the_next_sweep(tmp_path):
    """No one asks about an invented node again: its revocation, written but not pushed, stayed off the server."""
    cloud = FakeCloud()
    process, pushes = process_with(tmp_path, cloud, "od-invented")
    process.pushed = Minter.load(tmp_path / "minter.json").issued_at  # as pushed by this process so far
    pushes.fail = 1
    with pytest.raises(TimeoutError):
        await process.sweep()
    assert await process.sweep() == [] and len(pushes.sent) == 1  # nothing new to revoke, the account pushed
    revoked = Minter.load(tmp_path / "minter.json")
    assert revoked.issued_at == process.pushed and "od-invented" in revoked.retired
    assert await process.sweep() == [] and len(pushes.sent) == 1  # pushed: not again


async def test_a_machine_being_stopped_keeps_its_agents_identity_until_it_is_gone(tmp_path):
    """A spot instance AWS is terminating still carries its agent, reporting its checkpointed tasks' ends."""
    cloud = FakeCloud(stopping={"od-1"})
    process, _ = process_with(tmp_path, cloud, "od-1")
    assert await process.sweep() == []
    cloud.stopping.clear()
    assert await process.sweep() == ["od-1"]
