"""Job-supplied metric patterns: RE2 only, checked at submission, matched against bounded lines."""

import pytest
from pydantic import ValidationError

from shared.events import LogLine
from shared.jobs import JobCreate, MetricSpec
from shared.safe_regex import (
    MAX_LINE_CHARS,
    REPLAY_PER_LINE_S,
    REPLAY_S,
    MatchBudget,
    compile_metric,
    compile_pattern,
)
from services.estimator.model.mllog import MetricSpec as CorpusMetricSpec, RegexMetricParser
from services.estimator.tracker import JobTracker
from tests.factories import job_body

NESTED = r"(?P<value>a+)+$"  # (a+)+$: exponential for a backtracking engine on a's followed by anything else


def refusal(regex: str) -> tuple[list[str], str]:
    with pytest.raises(ValidationError) as info:
        metrics = [{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}, {"name": "acc", "regex": regex}]
        JobCreate.model_validate(job_body(metrics=metrics))
    errors = info.value.errors()
    return [".".join(str(p) for p in e["loc"]) for e in errors], errors[0]["msg"]


# A backtracking engine would still be matching when the timeout (a bound, not a measurement) ends the test.
@pytest.mark.timeout(20)
def test_a_nested_quantifier_against_a_long_line_of_as_returns():
    assert compile_pattern(r"(a+)+$").search("a" * 3000 + "!") is None
    tracker = JobTracker([MetricSpec(name="loss", regex=NESTED)])
    for n in (28, 40, 100, 3000, 100_000):
        assert tracker.observe(LogLine(t=1.0, line="a" * n + "!")) == []
    assert RegexMetricParser([CorpusMetricSpec("a", r"(a+)+$")]).parse("a" * 3000 + "!") == []


def test_lines_are_cut_before_matching():
    tracker = JobTracker([MetricSpec(name="loss", regex=r"loss (?P<value>[0-9.]+)")])
    (point,) = tracker.observe(LogLine(t=1.0, line="loss 0.5 " + "x" * 10 * MAX_LINE_CHARS))
    assert point.value == 0.5
    assert tracker.observe(LogLine(t=2.0, line="x" * MAX_LINE_CHARS + " loss 0.25")) == []


def test_named_groups_work_under_re2():
    pattern = compile_metric(r"step (?P<step>\d+) loss (?P<value>[0-9.eE+-]+)")
    assert pattern.search("epoch 1 step 12 loss 2.5e-1").groupdict() == {"step": "12", "value": "2.5e-1"}


@pytest.mark.parametrize(
    ("regex", "why"),
    [
        (r"(?P<value>\d+) \1", "RE2"),  # backreference
        (r"(?=loss)loss (?P<value>[0-9.]+)", "RE2"),  # lookahead
        (r"(?<!val_)loss (?P<value>[0-9.]+)", "RE2"),  # lookbehind
        (r"loss (?P<value>[0-9.]+", "RE2"),  # unbalanced
        (r"(?P<value>a{1000}){1000}", "RE2"),  # a program RE2 will not build
        (r"loss [0-9.]+", "`value`"),  # no group for the metric
        (r"step (\d+) loss ([0-9.]+)", "`value`"),  # two unnamed groups: which one is the metric?
        (r"step (?P<step>\d+) loss [0-9.]+", "`value`"),  # only the step
    ],
)
def test_patterns_re2_refuses_or_without_a_value_group_name_the_field(regex, why):
    fields, message = refusal(regex)
    assert fields == ["algorithm.metrics.1.regex"] and why in message


def test_a_valid_pattern_is_accepted():
    body = job_body(metrics=[{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}])
    assert JobCreate.model_validate(body).algorithm.metrics[0].regex == r"loss (?P<value>[0-9.]+)"


@pytest.mark.parametrize(
    ("regex", "line", "value", "step"),
    [
        (r"loss=([0-9.]+)", "epoch 1 loss=0.25", 0.25, None),  # SageMaker's convention: the one unnamed group
        (r"step (?P<step>\d+) loss=([0-9.]+)", "step 7 loss=0.5", 0.5, 7.0),  # named `step`, the unnamed one the value
        (r"(?P<value>[0-9.]+) after (\d+)", "0.75 after 3", 0.75, None),  # the named `value` wins
    ],
)
def test_one_unnamed_group_is_the_value_at_submission_and_when_matched(regex, line, value, step):
    body = job_body(metrics=[{"name": "loss", "regex": regex}])
    spec = JobCreate.model_validate(body).algorithm.metrics[0]
    (point,) = JobTracker([spec]).observe(LogLine(t=1.0, line=line))
    assert (point.value, point.step) == (value, step)
    (corpus,) = RegexMetricParser([CorpusMetricSpec("loss", regex)]).parse(line)
    assert (corpus.value, corpus.step) == (value, step)


# RE2 is linear in the line, with a factor the pattern sets: these were accepted before 2026-11-29.
HUGE = "(?P<value>" + ".{0,1000}" * 50 + ")y"  # 450,000 instructions: ~8 s of CPU to compile, ~1 s a line
WIDE = "(?P<value>.{0,250})y"  # 2,257 instructions


@pytest.mark.parametrize(("regex", "says"), [(HUGE, "past 65,536 bytes"), (WIDE, "2,257 instructions, at most 2,000")])
def test_a_pattern_too_large_to_match_cheaply_is_refused_by_name_at_once(regex, says):
    fields, message = refusal(regex)
    assert fields == ["algorithm.metrics.1.regex"]
    assert "too complex" in message and says in message
    with pytest.raises(ValueError, match="too complex"):
        compile_metric(regex)  # in a fraction of a millisecond to a few ms: the compile stops at its memory


def test_a_stored_pattern_refused_since_is_left_out_of_the_jobs_view_and_the_rest_shown():
    from services.submitter.views import stored_algorithm

    raw = JobCreate.model_validate(job_body(metrics=[{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}]))
    stored = raw.algorithm.model_dump() | {
        "metrics": [{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}, {"name": "acc", "regex": WIDE}]
    }
    shown = stored_algorithm(stored)
    assert [m.name for m in shown.metrics] == ["loss"] and shown.command == raw.algorithm.command
    assert JobTracker([MetricSpec.model_construct(name="acc", regex=WIDE)]).patterns == [None]  # nor read for values


class Clocks:
    """A reader's clock and the CPU a search takes, both set by the test."""

    def __init__(self, search_cost: float) -> None:
        self.now = 0.0
        self.cpu_now = 0.0
        self.search_cost = search_cost

    def clock(self) -> float:
        return self.now

    def cpu(self) -> float:  # each reading is `search_cost` on: a search (read before and after) costs that
        self.cpu_now += self.search_cost
        return self.cpu_now


def test_a_jobs_costly_patterns_are_searched_only_as_far_as_their_budget_pays():
    clocks = Clocks(search_cost=1 / 128)  # binary fractions: the arithmetic is exact
    budget = MatchBudget(rate=1 / 64, burst=1.0, clock=clocks.clock, cpu=clocks.cpu)
    pattern = compile_metric(r"loss (?P<value>[0-9.]+)")
    found = [budget.search(pattern, "loss 0.5") is not None for _ in range(150)]
    assert found == [True] * 128 + [False] * 22  # what was saved up, then nothing at once
    assert budget.skipped == 22 and budget.unreported() == 22 and budget.unreported() == 0
    clocks.now += 1.0  # a second later: 1/64 s more, two searches
    assert [budget.search(pattern, "loss 0.5") is not None for _ in range(3)] == [True, True, False]
    clocks.now += 1000.0  # refilled, never past the burst
    assert sum(budget.search(pattern, "loss 0.5") is not None for _ in range(150)) == 128


def test_a_jobs_usual_patterns_never_meet_the_budget():
    tracker = JobTracker([MetricSpec(name="loss", regex=r"step (?P<step>\d+) loss (?P<value>[0-9.eE+-]+)")])
    lines = [LogLine(t=i / 500, line=f"step {i} loss {1 / (i + 1):.5f} lr 0.001 " + "x" * 200) for i in range(5000)]
    assert sum(len(tracker.observe(line)) for line in lines) == 5000  # ten seconds of a task's most output
    assert tracker.budget.skipped == 0


def test_lines_read_again_bring_their_own_budget_a_usual_patterns_all_of_them_a_slow_ones_for_a_bounded_time():
    """A job's kept lines are read again at a restart and at each query of a finished job's curves: each brings
    200 us (25 usual searches), so a usual pattern's curve comes back whole, and a pattern 50 ms a line is read
    for about a second and what its lines brought, not for hours."""
    clocks = Clocks(search_cost=8e-6)
    tracker = JobTracker([MetricSpec(name="loss", regex=r"step (?P<step>\d+) loss (?P<value>[0-9.]+)")])
    tracker.budget = MatchBudget.replaying()
    tracker.budget.clock, tracker.budget.cpu = clocks.clock, clocks.cpu
    lines = [LogLine(t=float(i), line=f"step {i} loss {1 / (i + 1):.5f}") for i in range(20_000)]
    found = 0
    for line in lines:
        tracker.budget.grant(REPLAY_PER_LINE_S)
        found += len(tracker.observe(line))
    assert found == 20_000 and tracker.budget.skipped == 0
    slow = MatchBudget.replaying()
    slow.clock, slow.cpu = clocks.clock, Clocks(search_cost=0.05).cpu
    pattern = compile_metric(r"loss (?P<value>[0-9.]+)")
    read = 0
    for _ in range(2000):
        slow.grant(REPLAY_PER_LINE_S)
        read += slow.search(pattern, "loss 0.5") is not None
    assert read <= 1 + (REPLAY_S + 2000 * REPLAY_PER_LINE_S) / 0.05 + 1  # ~1.4 s of 50-ms searches, not 100 s


async def test_a_stored_job_whose_pattern_is_now_refused_reads_back_without_it():
    """Placement's queue, the API's view and a search's template read stored jobs back: one stored with a pattern
    this version refuses is still read (placement would otherwise fail at every start), without that metric."""
    from datetime import UTC, datetime

    from shared.store import DocumentStore
    from shared.stored import readable_template
    from services.placement.queue import JobQueue
    from tests.memory import MemoryCollection

    metrics = [{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}, {"name": "acc", "regex": WIDE}]
    collection = MemoryCollection("placement_jobs")
    collection.docs["old"] = {
        "_id": "old",
        "job_id": "old",
        "project_id": "p",
        "user_name": "alice",
        "algorithm": {"command": "true", "metrics": metrics},
        "spec": {"resource": {"cpu_count": 1}},
        "submitted_at": datetime(2026, 11, 1, tzinfo=UTC),
        "state": "queued",
    }
    queue = JobQueue(DocumentStore(collection, None))
    await queue.load(now=datetime(2026, 11, 29, tzinfo=UTC))
    assert [m.name for m in queue.items["old"].algorithm.metrics] == ["loss"] and queue.queued == {"old"}
    template = readable_template({"algorithm": {"command": "true", "metrics": metrics}})
    assert [m["name"] for m in template["algorithm"]["metrics"]] == ["loss"]


@pytest.mark.parametrize(
    "regex", [r"\p{L}+ (?P<value>\d+)", r"(?P<value>.{0,100})", r"loss[^0-9]{0,40}(?P<value>[0-9.]+)"]
)
def test_a_wide_but_usual_pattern_is_accepted_and_matched_with_re2s_own_memory(regex):
    pattern = compile_metric(regex)
    assert pattern.programsize <= 2000 and pattern.search("loss 12") is not None
