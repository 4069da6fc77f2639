"""A process's database command counts (`TRAINMASTER_DB_COMMAND_COUNTS`, for the benchmarks) reach their file a
second after the last command at the latest, even when no command follows it (a process at rest)."""

import json
from types import SimpleNamespace

from shared.store import CommandCounts
from tests.conftest import eventually


def insert() -> SimpleNamespace:
    return SimpleNamespace(command={"insert": "jobs"}, command_name="insert")


async def test_the_last_commands_are_written_without_another_command(tmp_path):
    counts = CommandCounts(tmp_path)
    counts.started(insert())  # written at once
    counts.started(insert())  # within the second: waits, and no command comes after it

    def written() -> int:
        return json.loads(counts.path.read_text())["sent"]["jobs.insert"]

    async def both_written() -> bool:
        return written() == 2

    assert written() == 1
    assert await eventually(both_written, timeout_s=5, interval_s=0.1)
