"""Progress read from what jobs print: the real libraries' output (captured by tests/data/progress/capture.py, read
as the agent ships it: one line per newline or carriage return), hand-written lines where no library was run, and
hostile lines that must be ignored without raising."""

import re
from pathlib import Path

from hypothesis import given, settings, strategies as st

from services.estimator.model.progress import ProgressReader, read_line

DATA = Path(__file__).parents[2] / "data" / "progress"


def replayed(name: str) -> list:
    """The reader's progress after each line of a capture, split where a terminal would."""
    text = (DATA / f"{name}.txt").read_bytes().decode(errors="replace")
    reader = ProgressReader()
    return [reader.observe(line, float(i)) for i, line in enumerate(re.split(r"[\r\n]", text))]


def moving(seen: list) -> list:
    return [p for p in seen if p is not None and p.total is not None]


def test_a_plain_tqdm_bar_and_nested_bars_count_in_the_outermost_that_moves():
    seen = moving(replayed("tqdm"))
    first = [p for p in seen if p.total == 200]
    assert first[0].source == "tqdm" and first[0].unit == "it" and first[0].rate > 0
    assert first[-1].done == 200
    # `Epoch` (3) around `Iteration` (40, leave=False): counted in iterations over all epochs, from the first round
    # on (the outer bar is drawn at 0 once before it, then only when a round ends)
    nested = seen[len(first) :]
    assert nested and {p.total for p in nested} == {120}
    assert nested[-1].done == 120
    assert all(b.done >= a.done for a, b in zip(nested, nested[1:]))


def test_hugging_face_trainer_counts_its_steps_and_its_evaluation_bars_do_not_count():
    seen = moving(replayed("hf-trainer"))
    assert {p.total for p in seen} == {48}
    assert {p.source for p in seen} == {"hf-trainer"}
    assert seen[-1].done == 48
    assert all(b.done >= a.done for a, b in zip(seen, seen[1:]))  # the 2-batch evaluation bar is not the job's


def test_keras_epochs_times_steps_per_epoch():
    seen = moving(replayed("keras"))
    steps = [p for p in seen if p.unit == "step"]
    assert {p.total for p in steps} == {3 * 36}
    assert {p.source for p in seen} == {"keras"}
    assert steps[-1].done == 108
    assert all(b.done >= a.done for a, b in zip(steps, steps[1:]))


def test_lightning_bar_counts_epochs_and_its_rich_bar_names_the_last_epoch():
    seen = [p for p in replayed("lightning-tqdm") if p is not None]
    assert {p.source for p in seen} == {"lightning"} and {p.unit for p in seen} == {"epoch"}
    assert seen[-1].done == 3.0  # `Epoch 2` (0-based) complete; the validation and sanity bars are not counted
    assert all(b.done >= a.done for a, b in zip(seen, seen[1:]))
    [rich] = read_line((DATA / "lightning.txt").read_text().splitlines()[-2])
    assert (rich.source, rich.n, rich.total, rich.epoch) == ("lightning", 20, 20, (2, 2))


def test_step_lines_of_torchrun_deepspeed_and_megatron():
    def last(*lines):
        reader = ProgressReader()
        return [reader.observe(line, float(i)) for i, line in enumerate(lines)][-1]

    assert last("step 120/1000 loss=2.3") == last("Step [120/1000] loss: 2.3")
    assert last(" iteration      120/    1000 | consumed samples: 3840 | lm loss: 7.1").done == 120
    assert (
        last(
            "[2026-11-26 12:00:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=120, skipped=0, "
            "lr=[0.0001], mom=[(0.9, 0.999)]"
        ).total
        is None
    )  # DeepSpeed: a count, its total is declared
    assert last("Epoch [3/10] loss 0.2").total == 10


def test_hostile_bars_are_ignored():
    reader = ProgressReader()
    for i in range(50):  # a total that changes on every line is no total
        reader.observe(f"{i}%|##| {i}/{1000 + i} [00:01<00:02, 3.0it/s]", float(i))
    assert reader.progress() is None
    assert read_line("37%|##| 370/1000000000000000000 [00:12<00:20, 30.1it/s]") == []  # 10^18 steps
    assert read_line("37%|##| 3700/1000 [00:12<00:20, 30.1it/s]") == []  # past its total
    assert read_line("Epoch 11/10") == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=200)
        | st.builds(
            lambda n, m, d: f"{d}{n}%|█| {n}/{m} [00:01<00:02, {n}it/s]\rEpoch {n}/{m}",
            st.integers(-10, 10**20),
            st.integers(-10, 10**20),
            st.text(max_size=10),
        ),
        max_size=30,
    )
)
def test_no_line_makes_the_reader_raise(lines):
    reader = ProgressReader()
    for i, line in enumerate(lines):
        p = reader.observe(line, float(i))
        assert p is None or (p.done >= 0 and (p.total is None or p.total > 0 and p.done <= p.total))


def test_older_and_scaled_forms():
    [keras2] = read_line("125/1875 [=>............................] - ETA: 1:02 - loss: 0.3012")
    assert (keras2.source, keras2.n, keras2.total) == ("keras", 125, 1875)
    [scaled] = read_line("Downloading:  12%|█▏        | 1.20k/10.0k [00:03<00:21, 412B/s]")
    assert (scaled.n, scaled.total, scaled.unit, scaled.rate) == (1200, 10000, "B", 412)
    [slow] = read_line("Training:  40%|████      | 4/10 [01:00<01:30, 15.00s/it]")
    assert slow.rate == 1 / 15 and slow.name == "Training:"
    [hf] = read_line("{'loss': 0.6929, 'learning_rate': 4.5e-05, 'epoch': 0.31}")  # older transformers: unquoted
    assert (hf.kind, hf.source) == ("epoch-fraction", "hf-trainer")
