"""bench.submit: commands per job without what its own "all done yet?" pages cost the API; where an idle job waited."""

from collections import Counter

from bench.submit import commands_per_job, phases_of


def test_the_benchs_own_polls_are_left_out_of_the_apis_commands_and_reported_apart():
    before = {"submitter": Counter({"api_jobs.update": 10}), "monitor": Counter({"monitor_jobs.update": 5})}
    after = {
        "submitter": Counter({"api_jobs.update": 40, "api_job_list.find": 6, "api_job_list.aggregate": 6}),
        "monitor": Counter({"monitor_jobs.update": 35}),
    }
    figures = commands_per_job(before, after, jobs=10, bench=12)  # six polls of two commands each
    assert figures["db_commands_per_job_by_process"] == {"monitor": 3.0, "submitter": 3.0}
    assert figures["db_commands_per_job"] == 6.0
    assert figures["db_commands_per_job_bench_polls"] == 1.2


def test_an_idle_jobs_wait_is_split_at_its_first_placement():
    job = {
        "metadata": {"create_time": 1_000},
        "status": {"start_time": 1_480, "attempts": [{"placed_at": 1_400, "node_ids": ["bench-0"]}]},
    }
    assert phases_of(3, job) == {
        "job": 3,
        "submit_to_running_s": 0.48,
        "to_placed_s": 0.4,
        "placed_to_running_s": 0.08,
        "node": "bench-0",
    }
