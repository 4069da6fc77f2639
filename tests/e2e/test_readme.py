"""The README's commands, taken from the README itself (the ```sh blocks after `<!-- readme-test -->`), run as a
newcomer runs them, top to bottom, against the test stack, and again: every command exits 0.

The second pass runs the blocks that meet what the first left behind: ana exists (the admin is answered so), her
token is issued again, her jobs are listed beside the first pass's. The blocks after them, the PyTorch example and the
search, make nothing that a second run meets: the API names their jobs, as it names the second pass's, and the search
(`tests/unit/test_search_api.py`), so they run once (a second pass of them was seven PyTorch processes, ~70 s of a
worker)."""

import os
import re
import subprocess
import sys
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
    folder = newcomer_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path), PATH=os.defpath)
    for run, ran in ((1, blocks), (2, meets_the_first_pass(blocks))):
        script = trace + "\n".join(ran).replace(README_API, stack.api_url)
        done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, (run, done.stdout[-3000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr and "already exists in project" not in done.stdout, (run, done.stdout)
        closings = re.findall(
            r"^job-[0-9a-f]{8} \(\S+\): Completed after .* cost \$[0-9.]+, exit 0$", done.stderr, flags=re.M
        )
        # the CLI's job, and on the first pass the PyTorch example and the search
        assert len(closings) == (2 if run == 1 else 1), (run, done.stderr[-3000:])
        if run == 1:
            assert re.search(r"^search-[0-9a-f]{8} Completed: ", done.stderr, flags=re.M), done.stderr[-3000:]
            assert "best: trial" in done.stdout, done.stdout[-3000:]
        else:  # ana existed: the admin was told so, and her token still came
            assert "already exists" in done.stdout, done.stdout[-3000:]
