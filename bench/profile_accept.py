"""Where the API's CPU goes while it accepts a burst of jobs: a `bench.submit` stack whose submitter runs under
cProfile, profiled over the burst's accept phase alone (POST /training-jobs from N clients), the top functions
printed by own time and by cumulative time. Run: `python -m bench.profile_accept --jobs 200 --concurrency 8`."""

import argparse
import asyncio
import os
import pstats
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.submit import TOKEN, bench_settings, cluster, history_model_trained, submit_noop
from services.stack.processes import Stack, StackSettings

# The submitter as the stack starts it, with a profile kept from SIGUSR2 (started afresh) to SIGUSR1 (written).
# Written beside it, then renamed: a reader never sees a profile half written.
LAUNCHER = """
import cProfile, os, runpy, signal, sys, time
out, profile = sys.argv[1], cProfile.Profile(time.process_time)  # CPU, not wall time: the VM is shared
def fresh(*_):
    profile.disable(); profile.clear(); profile.enable()
def write(*_):
    profile.disable(); profile.dump_stats(out + ".part"); os.replace(out + ".part", out)
signal.signal(signal.SIGUSR2, fresh)
signal.signal(signal.SIGUSR1, write)
sys.argv = ["services.submitter"]
profile.enable()
runpy.run_module("services.submitter", run_name="__main__", alter_sys=True)
"""


class ProfiledStack(Stack):
    def __init__(self, settings: StackSettings, *, out: Path) -> None:
        super().__init__(settings)
        self.out = out

    def _spawn(self, name, argv, *, env=None, umask=-1):
        if name == "submitter":
            argv = [sys.executable, "-c", LAUNCHER, str(self.out)]
        return super()._spawn(name, argv, env=env, umask=umask)


async def burst(stack: ProfiledStack, *, jobs: int, concurrency: int) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) as api:
        await history_model_trained(api)
        names = iter(range(jobs))

        async def client() -> None:
            for i in names:
                await submit_noop(api, i, [])

        pid = stack.processes["submitter"].pid
        os.kill(pid, signal.SIGUSR2)
        await asyncio.sleep(0.2)
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        accepted_s = time.perf_counter() - started
        await written(stack.out, ask=lambda: os.kill(pid, signal.SIGUSR1))
        return accepted_s


async def written(out: Path, *, ask: Callable[[], None], timeout_s: float = 10.0) -> None:
    """Ask for the profile (`ask`) and wait until it is written to `out`: a file already there (an earlier run's,
    `--save` onto it) is removed first, so it is never read for this one."""
    out.unlink(missing_ok=True)
    ask()
    for _ in range(int(timeout_s / 0.1)):
        if out.exists():
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the submitter wrote no profile to {out} in {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--save", type=Path, help="keep the profile here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tm-profile-") as tmp:
        data = Path(tmp)
        (data / "cluster.toml").write_text(cluster(3))
        out = args.save or data / "submitter.prof"
        stack = ProfiledStack(bench_settings(data), out=out)
        stack.extra_env["TRAINMASTER_MLPERF_DIR"] = str(data / "no-mlperf-logs")
        try:
            stack.start_all()
            time.sleep(3)
            accepted_s = asyncio.run(burst(stack, jobs=args.jobs, concurrency=args.concurrency))
        finally:
            stack.stop_all()
        print(f"{args.jobs} jobs accepted in {accepted_s:.1f} s ({args.jobs / accepted_s:.1f} jobs/s)")
        stats = pstats.Stats(str(out))
        total = stats.total_tt  # type: ignore[attr-defined]
        print(f"submitter CPU profiled over the burst: {total:.2f} s ({total / args.jobs * 1000:.1f} ms a job)")
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
