"""The bounded memory behind remembered job states, quotas and placements."""

import pytest

from shared.lru import Lru


def test_the_least_recently_used_goes_first_and_a_read_counts_as_a_use():
    kept = Lru(2)
    kept.put("a", 1)
    kept.put("b", 2)
    assert kept.get("a") == 1  # a is now the most recent
    kept.put("c", 3)
    assert (kept.get("a"), kept.get("b"), kept.get("c"), len(kept)) == (1, None, 3, 2)
    kept.put("a", 10)  # a new value is a use too
    kept.put("d", 4)
    assert (kept.get("a"), kept.get("c")) == (10, None)
    kept.pop("a")
    kept.pop("missing")
    assert kept.get("a") is None and len(kept) == 1


def test_size_zero_keeps_nothing_and_a_negative_size_is_refused():
    nothing = Lru(0)
    assert nothing.put("a", 1) == 1 and nothing.get("a") is None and len(nothing) == 0
    with pytest.raises(ValueError, match="size"):
        Lru(-1)
