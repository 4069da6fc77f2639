"""The spot notice: reading the metadata's answers (hostile ones too), what the agent does on one, and when
placement should choose spot at all."""

import pytest

from services.agent.spot import Notice, leave_on_notice, parse_notice
from services.placement.policy.spot import SpotOffer, choose_spot, expected_cost


@pytest.mark.parametrize(
    "kind, status, body, expected",
    [
        (
            "interruption",
            200,
            b'{"action": "terminate", "time": "2026-11-23T18:00:00Z"}',
            Notice("interruption", "terminate", "2026-11-23T18:00:00Z"),
        ),
        ("interruption", 200, b'{"action": "hibernate", "time": "t"}', Notice("interruption", "hibernate", "t")),
        ("interruption", 404, b"Not Found", None),
        ("interruption", 200, b'{"action": "rm -rf /", "time": "t"}', None),
        ("interruption", 200, b"[1, 2]", None),
        ("interruption", 200, b"not json", None),
        ("interruption", 200, b'{"action": "terminate", "time": "' + b"x" * 5000 + b'"}', None),
        (
            "rebalance",
            200,
            b'{"noticeTime": "2026-11-23T17:58:00Z"}',
            Notice("rebalance", "rebalance", "2026-11-23T17:58:00Z"),
        ),
        ("rebalance", 200, b'{"noticeTime": 5}', None),
    ],
)
def test_parse_notice(kind, status, body, expected):
    assert parse_notice(kind, status, body) == expected


class Agent:
    """What leave_on_notice uses of the agent: its node, publishing, shutting its tasks down."""

    def __init__(self) -> None:
        self.node = type("Node", (), {"node_id": "od-x"})()
        self.boot_id = "b1"
        self.calls: list = []

    async def publish_reliably(self, message) -> None:
        self.calls.append(("publish", message))

    async def shutdown(self, reason: str) -> None:
        self.calls.append(("shutdown", reason))


async def test_a_notice_tells_placement_first_then_snapshots_then_leaves():
    agent, left = Agent(), []
    await leave_on_notice(agent, exit_process=lambda: left.append(True))(Notice("interruption", "terminate", "t0"))
    (first, event), (second, reason) = agent.calls
    assert first == "publish" and event.node_id == "od-x" and event.subject == "tm.node.evt.od-x.interrupted"
    assert second == "shutdown" and reason == "spot interruption: terminate at t0"
    assert left == [True]


def test_spot_is_for_jobs_that_checkpoint_and_only_when_it_pays():
    cheap = SpotOffer(price_per_hour=0.4, on_demand_price_per_hour=1.0, interruptions_per_hour=0.1)
    assert choose_spot(cheap, checkpoints=True, duration_s=7200, checkpoint_interval_s=600)
    assert not choose_spot(cheap, checkpoints=False, duration_s=7200, checkpoint_interval_s=600)
    risky = SpotOffer(price_per_hour=0.9, on_demand_price_per_hour=1.0, interruptions_per_hour=2.0)
    assert not choose_spot(risky, checkpoints=True, duration_s=7200, checkpoint_interval_s=600)
    assert not choose_spot(cheap, checkpoints=True, duration_s=7200, checkpoint_interval_s=600, deadline_slack_s=10)
    cost, total = expected_cost(cheap, duration_s=3600, checkpoint_interval_s=600)
    assert total == pytest.approx(3600 + 0.1 * (300 + 300)) and cost == pytest.approx(0.4 * total / 3600)


def test_the_watcher_is_off_unless_a_metadata_url_is_set():
    from services.agent.app import AgentSettings

    assert AgentSettings(node_id="n").spot_metadata_url is None
