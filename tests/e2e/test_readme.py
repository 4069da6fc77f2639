"""The README's commands, taken from the README itself (the ```sh blocks after `<!-- readme-test -->`), run as a
newcomer runs them, top to bottom, against the test stack, and again: every command exits 0.

The second pass runs the blocks that meet what the first left behind: ana exists (the admin is answered so), her
token is issued again, her jobs are listed beside the first pass's. The blocks after them, the PyTorch example and the
search, make nothing that a second run meets: the API names their jobs, as it names the second pass's, and the search
(`tests/unit/test_search_api.py`), so they run once (a second pass of them was seven PyTorch processes, ~70 s of a
worker). The second pass runs beside the first's examples, once the first has run the blocks it meets."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADMIN_TOKEN

# The ETA tests' watched jobs (tests/e2e/watches.py: a minute or more of real time, mostly waiting) run beside this
# test, which computes: the suite waits for them once, and not on top of it.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("watches")]
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_API = "http://127.0.0.1:8080"


def readme_blocks() -> list[str]:
    blocks = re.findall(r"<!-- readme-test -->\s*\n```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4, "the README's tested blocks are gone"
    return blocks


def meets_the_first_pass(blocks: list[str]) -> list[str]:
    """The blocks before the first that runs a shipped example: those whose second run meets the first's user."""
    examples = next(i for i, block in enumerate(blocks) if "trainmaster_examples" in block or "search create" in block)
    assert examples >= 2 and "users" in blocks[0], "the README's blocks changed: say which a second run meets"
    return blocks[:examples]


def newcomer_folder(tmp_path: Path) -> Path:
    """What a fresh clone holds after `make run`: .venv, .trainmaster/admin-token, the examples."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.fail(f"the tests run outside a virtual environment ({sys.prefix}): the README sources .venv")
    folder = tmp_path / "clone"
    (folder / ".trainmaster").mkdir(parents=True)
    (folder / ".trainmaster" / "admin-token").write_text(ADMIN_TOKEN + "\n")
    (folder / ".venv").symlink_to(venv)
    (folder / "examples").symlink_to(ROOT / "examples")
    return folder


def test_the_readme_runs_as_written_and_again(stack, tmp_path):
    trace = "set -eo pipefail; PS4='+ $(date +%T) '; set -x\n"  # a failure shows what ran, and when
    blocks = readme_blocks()
    again = meets_the_first_pass(blocks)
    folder = newcomer_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path), PATH=os.defpath)
    # The second pass starts once the first has run the blocks it meets (a line the harness adds between them, not
    # the README's), beside the first pass's examples: one after the other they held a worker ~20 s longer.
    met = tmp_path / "met"
    first = "\n".join([*again, f": > {met}", *blocks[len(again) :]])
    runs = {1: start(trace + first.replace(README_API, stack.api_url), folder, env, 1)}
    for _ in range(1500):
        if met.exists() or runs[1].poll() is not None:
            break
        time.sleep(0.1)
    if met.exists():
        runs[2] = start(trace + "\n".join(again).replace(README_API, stack.api_url), folder, env, 2)
    try:
        done = {run: (process.wait(timeout=150), *outputs(folder, run)) for run, process in runs.items()}
    finally:
        for process in runs.values():
            process.kill()  # one that timed out: nothing of it runs on into the next test
    code, stdout, stderr = done[1]
    assert 2 in done, ("the first pass ended before the blocks the second meets", code, stdout[-3000:], stderr[-3000:])
    for run, (code, stdout, stderr) in done.items():
        assert code == 0, (run, stdout[-3000:], stderr[-3000:])
        assert "Traceback" not in stderr and "already exists in project" not in stdout, (run, stdout)
        closings = re.findall(
            r"^job-[0-9a-f]{8} \(\S+\): Completed after .* cost \$[0-9.]+, exit 0$", stderr, flags=re.M
        )
        # the CLI's job, and on the first pass the PyTorch example and the search
        assert len(closings) == (2 if run == 1 else 1), (run, stderr[-3000:])
        if run == 1:
            assert re.search(r"^search-[0-9a-f]{8} Completed: ", stderr, flags=re.M), stderr[-3000:]
            assert "best: trial" in stdout, stdout[-3000:]
        else:  # ana existed: the admin was told so, and her token still came
            assert "already exists" in stdout, stdout[-3000:]


def start(script: str, folder: Path, env: dict[str, str], run: int) -> subprocess.Popen:
    """A pass's shell, in the newcomer's folder, its output in files beside it (a pipe not read while the first pass
    runs would fill and stop it)."""
    with open(folder.parent / f"pass{run}.out", "w") as out, open(folder.parent / f"pass{run}.err", "w") as err:
        return subprocess.Popen(["bash", "-c", script], cwd=folder, env=env, stdout=out, stderr=err)


def outputs(folder: Path, run: int) -> tuple[str, str]:
    return (folder.parent / f"pass{run}.out").read_text(), (folder.parent / f"pass{run}.err").read_text()
