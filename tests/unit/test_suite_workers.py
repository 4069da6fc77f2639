"""The suite under pytest-xdist (`make test`): how tests/conftest.py keeps tests that share something on one worker,
and what each worker keeps apart."""

import asyncio
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.e2e import watches


class Item:
    """What the grouping hook reads of a collected test."""

    def __init__(self, nodeid: str, *fixtures: str, group: str | None = None, watched: str | None = None) -> None:
        self.nodeid, self.fixturenames, self.markers = nodeid, ["request", *fixtures], []
        if group:
            self.markers.append(pytest.mark.xdist_group(group).mark)
        if watched:
            self.markers.append(pytest.mark.watched(watched).mark)

    def get_closest_marker(self, name: str):
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker) -> None:
        self.markers.append(marker.mark)

    def group(self) -> str:
        [marker] = [m for m in self.markers if m.name == "xdist_group"]
        return marker.args[0]


def test_a_modules_tests_share_a_worker_and_so_its_module_scoped_stack():
    items = [
        Item("tests/e2e/test_failover.py::test_a"),
        Item("tests/e2e/test_failover.py::test_b[1]"),
        Item("tests/e2e/test_chaos.py::test_chaos", "stack"),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.group() for i in items] == [
        "tests/e2e/test_failover.py",
        "tests/e2e/test_failover.py",
        "tests/e2e/test_chaos.py",
    ]


def test_the_watched_jobs_tests_and_the_gpu_tier_each_share_a_worker_and_a_group_given_by_hand_stays():
    items = [
        Item("tests/e2e/test_eta_replay.py::test_a", "watches", watched="mlperf-seen"),
        Item("tests/e2e/test_eta_unseen_benchmark.py::test_b", "api", "watches", watched="mlperf-unseen"),
        Item("tests/gpu/test_gpu_jobs.py::test_c", "gpu_api"),
        Item("tests/gpu/test_nvml_telemetry.py::test_d"),
        Item("tests/e2e/test_search.py::test_e", group="by-hand"),
        Item("tests/e2e/test_readme.py::test_f", "stack", "watches"),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [(i.nodeid.split("::")[1], i.group()) for i in items] == [
        ("test_f", "eta-watches"),  # first in its group: it runs while the watched jobs do
        ("test_a", "eta-watches"),
        ("test_b", "eta-watches"),
        ("test_c", "gpu"),
        ("test_d", "gpu"),
        ("test_e", "by-hand"),
    ]


def test_the_longest_groups_go_out_first_then_the_whole_stack_tiers_then_the_quick_ones():
    items = [
        Item("tests/unit/test_a.py::test_a"),
        Item("tests/service/test_b.py::test_b"),
        Item("tests/e2e/test_lifecycle.py::test_c", "stack"),
        Item("tests/integration/test_d.py::test_d"),
        Item("tests/e2e/test_eta_replay.py::test_f", "watches", watched="mlperf-seen"),
        Item("tests/e2e/test_readme.py::test_e", "stack", "watches"),
        Item("tests/e2e/test_task_isolation.py::test_g", "stack"),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid.split("::")[1] for i in items] == [
        "test_e",
        "test_f",
        "test_g",
        "test_c",
        "test_d",
        "test_b",
        "test_a",
    ]


def test_under_two_workers_each_modules_tests_run_on_one_worker():
    """The whole point of the groups, checked through pytest-xdist itself (pytest 9.2 stopped reading the ids
    pytest-xdist 3.8 rewrites: every module was spread over both workers, its stack started twice)."""
    root = Path(__file__).resolve().parents[2]
    modules = ["tests/unit/placement/test_sim_spot.py", "tests/unit/placement/test_placement_sim.py"]
    # the plugins these modules do not use left out: each of the three processes loaded them (1.5 s of CPU in all)
    plugins = ["no:cacheprovider", "no:schemathesis", "no:hypothesispytest", "no:kmock"]
    command = [sys.executable, "-m", "pytest", *(f"-p{p}" for p in plugins)]
    done = subprocess.run(
        [*command, "-v", "-n", "2", "--dist", "loadgroup", *modules],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "TRAINMASTER_TEST_TIMELINE"},  # not this suite's timeline
    )
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"\[(gw\d)\] .*?PASSED (\S+?)::", done.stdout)
    workers = {module: {w for w, m in ran if m == module} for module in modules}
    assert all(len(w) == 1 for w in workers.values()) and len(ran) > 10, workers


async def test_watches_run_side_by_side_each_test_gets_its_result_or_its_error_and_a_cancel_ends_them(monkeypatch):
    started = threading.Barrier(2, timeout=30)  # both watches under way at once, or neither gets past it

    async def together(api, stack):
        await asyncio.to_thread(started.wait)
        return str(api.base_url)

    async def broken(api, stack):
        await asyncio.to_thread(started.wait)
        raise ValueError("the job failed")

    async def forever(api, stack):
        await asyncio.Event().wait()

    for name, watch in (("together", together), ("broken", broken), ("forever", forever)):
        monkeypatch.setitem(watches.WATCHES, name, watch)
    stack = SimpleNamespace(api_url="http://127.0.0.1:9")  # never called
    running = watches.Watches(stack, ["together", "broken", "forever"])
    assert await running.result("together") == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="the job failed"):
        await running.result("broken")
    running.cancel()
    assert running.futures["forever"].cancelled() and not running.thread.is_alive()


async def test_watches_that_cannot_start_fail_every_test_waiting_for_one_with_why(monkeypatch):
    """A failure before any watch runs (the watch's name unknown, the API client not made) reaches each waiting test
    at once; it does not leave them waiting until their timeouts with the cause printed by a dying thread only."""
    monkeypatch.delitem(watches.WATCHES, "unknown", raising=False)
    running = watches.Watches(SimpleNamespace(api_url="http://127.0.0.1:9"), ["unknown"])
    with pytest.raises(KeyError, match="unknown"):
        await asyncio.wait_for(running.result("unknown"), timeout=10)
    running.thread.join(timeout=10)
    assert not running.thread.is_alive()


async def test_a_test_that_gives_up_on_its_watch_leaves_the_watchs_result_alone(monkeypatch):
    """The test's timeout cancels its own wait, not the watch: the result is still there for whoever asks."""
    release = threading.Event()

    async def slow(api, stack):
        await asyncio.to_thread(release.wait, 30)
        return "done"

    monkeypatch.setitem(watches.WATCHES, "slow", slow)
    running = watches.Watches(SimpleNamespace(api_url="http://127.0.0.1:9"), ["slow"])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(running.result("slow"), timeout=0.2)
    assert not running.futures["slow"].cancelled()
    release.set()
    assert await asyncio.wait_for(running.result("slow"), timeout=10) == "done"
    running.cancel()


async def test_a_watch_that_ignores_its_cancellation_is_reported_at_teardown(monkeypatch):
    stop = threading.Event()

    async def stubborn(api, stack):
        stop.wait(30)  # blocks the watches' loop itself: no cancellation reaches it

    monkeypatch.setitem(watches.WATCHES, "stubborn", stubborn)
    monkeypatch.setattr(watches, "JOIN_S", 0.5)
    running = watches.Watches(SimpleNamespace(api_url="http://127.0.0.1:9"), ["stubborn"])
    try:
        with pytest.warns(UserWarning, match="stubborn"):
            running.cancel()
    finally:
        stop.set()
        running.thread.join(timeout=30)


def test_a_module_stack_stops_while_the_next_tests_run_and_the_session_waits_for_it(monkeypatch):
    release, stopped = threading.Event(), []

    class Stopping:
        data_dir = Path("stack0")

        def stop_all(self) -> None:
            release.wait(30)
            stopped.append("stack0")

    monkeypatch.setattr(conftest, "STOPPING", [])
    conftest.stop_later(Stopping())
    assert stopped == []  # back at once: the stop goes on in its own thread
    threading.Timer(0.1, release.set).start()
    conftest.pytest_sessionfinish(None)
    assert stopped == ["stack0"]


def test_the_session_stack_stops_once_the_next_test_comes_after_every_test_using_it(monkeypatch):
    stopped = threading.Event()

    class Running:
        data_dir = Path("session-stack")

        def stop_all(self) -> None:
            stopped.set()

    items = [
        Item("tests/unit/test_a.py::test_a"),
        Item("tests/e2e/test_lifecycle.py::test_b", "stack"),
        Item("tests/e2e/test_lifecycle.py::test_c", "stack"),
        Item("tests/integration/test_d.py::test_d", "stack"),
        Item("tests/integration/test_e.py::test_e"),
        Item("tests/service/test_f.py::test_f"),
    ]
    monkeypatch.setattr(conftest, "SESSION_STACK", {})
    monkeypatch.setattr(conftest, "STOPPING", [])
    conftest.pytest_collection_modifyitems(None, items)
    b, c, d, e, f, a = items
    one_process = SimpleNamespace(getoption=lambda name, default=None: default)
    reordering_worker = SimpleNamespace(workerinput={"workerid": "gw0"}, getoption=lambda name, default=None: True)
    in_order_worker = SimpleNamespace(workerinput={"workerid": "gw0"}, getoption=lambda name, default=None: False)

    def tear_down(item, nextitem, config) -> None:
        item.config = config
        hook = conftest.pytest_runtest_teardown(item, nextitem)
        next(hook)
        with pytest.raises(StopIteration):
            hook.send(None)

    conftest.SESSION_STACK["stack"] = Running()
    # a test using it comes next, one of the tier of the last that does (its module may come later), or the end
    for item, nextitem in ((b, c), (c, d), (d, e), (d, None)):
        tear_down(item, nextitem, one_process)
    tear_down(e, f, reordering_worker)  # its order unknown: an e2e test could still come
    assert "stack" in conftest.SESSION_STACK and not conftest.STOPPING
    tear_down(e, f, in_order_worker)  # after the last tier using it
    assert "stack" not in conftest.SESSION_STACK
    conftest.pytest_sessionfinish(None)
    assert stopped.is_set()
    tear_down(f, a, one_process)  # once stopped, nothing more
    assert len(conftest.STOPPING) == 1


def test_a_test_process_trains_on_one_thread():
    """Two workers share two cores: one thread each, or OpenMP's spinning makes both crawl (tests/conftest.py)."""
    import torch

    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])  # 1 unless the caller set another
