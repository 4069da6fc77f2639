"""Whether a task's output is all stored, and how many bytes a job's output holds, are counted and summed by the
database server (the embedded one here): one command each, no chunk document sent back, however much is stored."""

from shared.events import LogChunk
from services.submitter.repository import Repository
from tests.integration.test_status_writes import chunk, counted, database  # noqa: F401 (fixtures)


def of_node(seq: int, node_id: str, *, last: bool = False) -> LogChunk:
    """A chunk of task j/1/0 as `node_id` sent it (its own storage id)."""
    return chunk(seq, last=last).model_copy(update={"node_id": node_id, "event_id": f"j:1:0:{node_id}:{seq}"})


async def test_another_replica_counts_a_tasks_chunks_and_sums_a_jobs_bytes_on_the_server(counted):  # noqa: F811
    repo, commands = counted
    for seq in range(40):
        await repo.output.add(chunk(seq, last=seq == 39))
    other = Repository(db=repo.db, broker=None)  # another replica (or after a restart): nothing in memory
    commands.sent.clear()
    assert await other.output.complete("j", attempt=1, rank=0)
    assert await other.output.stored_bytes("j") == sum(len(f"line {seq}".encode()) + 1 for seq in range(40))
    assert dict(commands.sent) == {"aggregate": 2}  # every chunk was read back (its number, whether last)
    assert not await other.output.complete("j", attempt=2, rank=0)  # another attempt's output: none stored


async def test_numbers_stored_twice_do_not_stand_for_missing_ones(counted):  # noqa: F811
    """Distinct numbers from 0 to the last are counted, not chunks: two nodes' chunks of one number (the task
    placed on one, then, by a second placement of the attempt, on another) are one number."""
    repo, _ = counted
    for seq, node_id in [(0, "n"), (0, "m"), (2, "n")]:
        await repo.output.add(of_node(seq, node_id, last=seq == 2))
    other = Repository(db=repo.db, broker=None)
    assert not await other.output.complete("j", attempt=1, rank=0)
    await repo.output.add(of_node(1, "m"))
    assert await Repository(db=repo.db, broker=None).output.complete("j", attempt=1, rank=0)
