import pytest
from eta_factories import mllog

from services.estimator.model.mllog import MetricSpec, RegexMetricParser, parse_mllog_line


def test_parse_mllog_line_reads_key_value_time_and_metadata():
    rec = parse_mllog_line("prefix " + mllog("eval_accuracy", 0.71, t_ms=1234, epoch_num=3))
    assert (rec.key, rec.value, rec.time_ms) == ("eval_accuracy", 0.71, 1234)
    assert rec.metadata["epoch_num"] == 3
    assert rec.progress() == 3.0


@pytest.mark.parametrize("line", ["plain text", ":::MLLOG {not json", ':::MLLOG {"key": "x"}'])
def test_parse_mllog_line_rejects_other_lines(line):
    assert parse_mllog_line(line) is None


def test_progress_prefers_samples_and_ignores_booleans():
    rec = parse_mllog_line(mllog("x", t_ms=1, samples_count=512, epoch_num=2))
    assert rec.progress() == 512.0
    assert parse_mllog_line(mllog("x", t_ms=1, epoch_num=True)).progress() is None


def test_regex_parser_named_groups_and_plain_group():
    parser = RegexMetricParser(
        [
            MetricSpec("loss", r"step (?P<step>\d+) loss=(?P<value>[-\d.e]+)"),
            MetricSpec("acc", r"acc: ([\d.]+)"),
        ]
    )
    points = parser.parse("step 120 loss=2.5e-1 acc: 0.93")
    assert [(p.name, p.value, p.step) for p in points] == [("loss", 0.25, 120.0), ("acc", 0.93, None)]
    assert parser.parse("nothing here") == []


def test_regex_parser_skips_unparsable_values_and_needs_a_group():
    assert RegexMetricParser([MetricSpec("v", r"v=(\S+)")]).parse("v=abc") == []
    with pytest.raises(ValueError):
        RegexMetricParser([MetricSpec("bad", r"no group")])
