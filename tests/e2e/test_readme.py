"""The README's commands, taken from the README itself (the ```sh blocks after `<!-- readme-test -->`), run as a
newcomer runs them, top to bottom, twice in a row, against the test stack: every command exits 0."""

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


def readme_script() -> str:
    blocks = re.findall(r"<!-- readme-test -->\s*\n```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4, "the README's tested blocks are gone"
    return "\n".join(blocks)


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


def test_the_readme_runs_as_written_twice(stack, tmp_path):
    trace = "set -eo pipefail; PS4='+ $(date +%T) '; set -x\n"  # a failure shows what ran, and when
    script = trace + readme_script().replace(README_API, stack.api_url)
    folder = newcomer_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path), PATH=os.defpath)
    for run in (1, 2):
        done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, (run, done.stdout[-3000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr and "already exists in project" not in done.stdout, (run, done.stdout)
        closings = re.findall(
            r"^job-[0-9a-f]{8} \(\S+\): Completed after .* cost \$[0-9.]+, exit 0$", done.stderr, flags=re.M
        )
        assert len(closings) == 2, (run, done.stderr[-3000:])  # the CLI's job and the PyTorch example
        assert re.search(r"^search-[0-9a-f]{8} Completed: ", done.stderr, flags=re.M), (run, done.stderr[-3000:])
        assert "best: trial" in done.stdout, (run, done.stdout[-3000:])
