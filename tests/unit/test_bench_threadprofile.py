"""`bench.submit --thread-profile`: every Python process of the stack started with the bench's site folder on its
path profiles its main thread by its own CPU between SIGUSR2 and SIGUSR1 and writes the profile; the summary names the
functions that held it. A real child process."""

import cProfile
import os
import subprocess
import sys
import time

from bench import threadprofile

CHILD = """
import os, sys, time

def spin():
    total = 0
    for i in range(20000):
        total += i * i
    return total

def rest():
    time.sleep(0.001)

print("ready", flush=True)
sys.stdin.readline()  # the profile is started
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not os.path.exists(sys.argv[1]):
    spin()
    rest()
"""


def test_a_process_profiles_its_main_thread_between_the_signals_and_the_summary_names_its_work(tmp_path):
    folder, done = tmp_path / "profiles", tmp_path / "done"
    env = {**os.environ, **threadprofile.env(folder, os.environ.get("PYTHONPATH", ""))}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(done)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        threadprofile.start({"child": child.pid})
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(1.0)  # the child's work, profiled
        written = threadprofile.stop({"child": child.pid}, folder, timeout_s=30)
        assert written == {"child": folder / f"{child.pid}.prof"}
    finally:
        done.touch()
        child.wait(timeout=60)
    summary = threadprofile.summarize(written["child"])
    own = dict(summary["top_own"])
    spin = next(share for frame, share in own.items() if frame.startswith("spin ("))
    assert spin > 0.5  # its CPU: the sleeps between add nothing, as they would in wall time
    assert not any(frame.startswith("rest (") and share > 0.1 for frame, share in own.items())
    assert abs(sum(summary["by_kind"].values()) - 1) < 0.01


def test_without_the_variable_the_site_folder_does_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(threadprofile.SITE)}
    env.pop(threadprofile.VARIABLE, None)
    probe = "import signal; print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL)"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout == "True\n", done.stderr  # SIGUSR1 keeps its default


def test_an_empty_profile_is_summarized_as_nothing(tmp_path):
    empty = tmp_path / "1.prof"
    cProfile.Profile().dump_stats(str(empty))
    assert threadprofile.summarize(empty) == {"profiled_cpu_s": 0.0}
