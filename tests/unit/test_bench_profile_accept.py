"""`bench/profile_accept.py --save PATH` onto a file an earlier run left: the profile read is the one this run's
submitter writes, never the earlier one (it was found at once and read as this run's)."""

import asyncio
from pathlib import Path

import pytest

from bench.profile_accept import written


async def test_an_earlier_profile_at_the_path_is_not_taken_for_this_runs(tmp_path: Path):
    out = tmp_path / "submitter.prof"
    out.write_text("an earlier run's profile")
    loop = asyncio.get_running_loop()
    await written(out, ask=lambda: loop.call_later(0.3, out.write_text, "this run's profile"))
    assert out.read_text() == "this run's profile"


async def test_a_profile_never_written_is_an_error_not_an_earlier_one_read(tmp_path: Path):
    out = tmp_path / "submitter.prof"
    out.write_text("an earlier run's profile")
    with pytest.raises(RuntimeError, match="wrote no profile"):
        await written(out, ask=lambda: None, timeout_s=0.3)
