"""The built-in progress patterns read a line in time linear in its length: one line of job output could hold the
estimator's event loop for 15 s (4,000 spaces, then a digit: the tqdm pattern tried every description length at
every start; found by review), and `epoch`/`step` followed by a long run of spaces cost its square."""

import random
import re

import pytest

from services.estimator.model.progress import MAX_DESC, NUMBER, read_line, tqdm_bar

# The pattern `tqdm_bar` replaced, searched from the left: its readings are the reference.
SEARCHED = re.compile(
    rf"(?P<desc>[^|%]{{0,{MAX_DESC * 2}}}?)\s*\d{{1,3}}%\|[^|]{{0,120}}\|\s*(?P<n>{NUMBER})/"
    rf"(?P<total>{NUMBER})\s*\[(?P<info>[^\]]{{0,200}})\]"
)
PIECES = ["|", "%", " ", "\t", "1", "37", "100", "1000", "/", "[", "]", "a", "Epoch 3", ":", "█", "it/s", ", "]
BARS = ["Epoch 0:  37%|███▋      | 370/1000 [00:12<00:20, 30.1it/s, loss=1.2]", "train 5%|x| 5/100 [00:01<00:10]"]


def searched(text: str) -> dict[str, str] | None:
    m = SEARCHED.search(text)
    return None if m is None else {k: m[k] for k in ("desc", "n", "total", "info")}


def test_a_bar_is_read_as_the_searched_pattern_read_it():
    rng = random.Random(31)
    lines = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 30))) for _ in range(20_000)]
    for bar in BARS:
        for _ in range(3_000):
            at = rng.randrange(len(bar))
            lines.append(bar[:at] + rng.choice(PIECES) + bar[at:])
    lines += [" " * 200 + bar for bar in BARS] + ["x" * 300 + bar for bar in BARS]  # descriptions past 96
    assert [tqdm_bar(t) for t in lines] == [searched(t) for t in lines]
    assert sum(tqdm_bar(t) is not None for t in lines) > 1_000  # bars were read, not only refused


@pytest.mark.timeout(60)  # a hang guard, not a speed target: the code before took 15 s for each of these lines
def test_hostile_lines_are_read_without_holding_the_estimator():
    hostile = [
        " " * 4095 + "1",
        "\t" * 4094 + "9%",
        " " * 4093 + "1%|",
        "a" + " " * 4094 + "7",
        " " * 2000 + "1%|" + " " * 2000 + "|",
        "epoch" + " " * 4090 + "x",
        "step" + " " * 4091 + "1",
        "iteration" + " " * 2000 + "1" + " " * 2000,
    ] * 2
    for line in hostile:
        assert read_line(line) == []
