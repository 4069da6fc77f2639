"""The matrix's cache: a run is reused only under the code that produced it."""

import json

from bench.sched.matrix import CODE, DEFAULT_DATA, code_version, load_runs, run_version


def _tree(root, policy: str):
    for part in CODE:
        path = root / part
        if path.suffix == ".py":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x = 1\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "rules.py").write_text("x = 1\n")
    (root / CODE[0] / "rules.py").write_text(policy)


def test_the_code_version_changes_with_the_policy_code(tmp_path):
    _tree(tmp_path, "rate = 2\n")
    before = code_version(tmp_path)
    _tree(tmp_path, "rate = 3\n")

    assert code_version(tmp_path) != before


def test_a_cached_run_of_other_code_or_of_no_code_is_not_reused(tmp_path):
    cache = tmp_path / "runs.jsonl"
    lines = [
        ["trainmaster|v|8|4|0.0", {"on_demand_dollars": 1.0}],  # written before runs carried their code
        ["trainmaster|v|8|4|0.3|old", {"on_demand_dollars": 2.0}],
        ["trainmaster|v|16|8|0.0|new", {"on_demand_dollars": 3.0}],
    ]
    cache.write_text("".join(json.dumps(line) + "\n" for line in lines))

    assert load_runs([cache], code="new") == {"trainmaster|v|16|8|0.0": {"on_demand_dollars": 3.0}}


def test_a_run_at_another_exchange_rate_hazard_scale_or_trace_is_kept_apart(tmp_path):
    """The simulator's arguments and the trace are part of what a cached run was made with: a run at another
    exchange rate (or hazard scale, or data folder) is not reused for the default one, nor the other way round."""
    code = "abc"
    default = run_version(code, DEFAULT_DATA, [])
    rate = run_version(code, DEFAULT_DATA, ["--exchange-rate", "2.0"])
    hazard = run_version(code, DEFAULT_DATA, ["--spot-hazard-scale", "2.0"])
    trace = run_version(code, tmp_path, [])
    assert default == code  # the default runs keep the code's digest alone (caches made so far stay readable)
    assert len({default, rate, hazard, trace}) == 4
    assert run_version(code, DEFAULT_DATA, ["--exchange-rate", "2.0"]) == rate
