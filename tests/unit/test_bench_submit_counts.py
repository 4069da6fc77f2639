"""bench.submit's commands per job leave out what the bench's own "all done yet?" pages cost the API."""

from collections import Counter

from bench.submit import commands_per_job


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
