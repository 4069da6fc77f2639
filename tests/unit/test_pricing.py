"""One rule prices a rank's part of a node, for the price placement shows and decides and the price billed."""

import pytest

from shared.pricing import rank_price_per_hour
from services.billing import ledger
from services.placement.policy import cpu


@pytest.mark.parametrize(
    ("gpus", "node_gpus", "price"),
    [
        (1, 2, 2.0),  # its GPUs' share: two such attempts side by side pay the node once
        (3, 4, 3.0),
        (4, 4, 4.0),
        (8, 4, 4.0),  # never more than the whole node
        (0, 2, 4.0),  # a rank without GPUs takes the node
        (0, 0, 4.0),
        (1, 0, 4.0),  # the node's GPU count unknown: the node's price
    ],
)
def test_a_rank_pays_its_gpus_share_of_the_node_and_the_whole_node_without_them(gpus, node_gpus, price):
    assert rank_price_per_hour(4.0, gpus=gpus, node_gpus=node_gpus) == price


def test_placement_and_billing_price_by_that_one_rule():
    assert cpu.rank_price_per_hour is rank_price_per_hour is ledger.rank_price_per_hour
    opened = ledger.open_entry(
        key={"job_id": "j", "attempt": 1, "rank": 0},
        project_id="p",
        user_name="u",
        terms={"node_id": "n", "node_kind": "local", "price_per_hour": 6.0, "gpu_count": 3, "node_gpu_count": 4},
        started_at=None,
    )
    assert opened["price_per_hour"] == rank_price_per_hour(6.0, gpus=3, node_gpus=4) == 4.5
