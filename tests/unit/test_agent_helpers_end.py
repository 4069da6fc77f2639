"""The agent's helper processes (the killer, the shim server) end with what started them, not only by their
parent-death signal once it is gone: a stopped killer is reaped with its pipes closed, one that died is replaced
without leaving its pipes open, and a closed event loop's shim server is ended by the next loop's first use."""

import asyncio

import psutil

from services.agent import spawner as spawning
from services.agent.isolation import Killers


def gone(pid: int) -> bool:
    """Ended and reaped (a zombie is not gone: its parent never waited for it)."""
    return not psutil.pid_exists(pid)


def test_a_stopped_killer_is_reaped_and_its_pipes_closed():
    killers = Killers()
    killers.warm()
    process = killers._process
    assert process is not None and process.poll() is None
    killers.stop()
    assert killers._process is None and process.returncode is not None
    assert process.stdin.closed and process.stdout.closed
    killers.stop()  # twice: nothing more


def test_a_killer_that_died_is_replaced_and_its_pipes_closed():
    killers = Killers()
    killers.warm()
    dead = killers._process
    dead.kill()
    dead.wait()
    killers.warm()
    assert killers._process is not dead and killers._process.poll() is None
    assert dead.stdin.closed and dead.stdout.closed
    killers.stop()


def test_a_closed_loops_shim_server_is_ended_at_the_next_loops_first_use():
    async def started() -> spawning.Spawner:
        found = spawning.spawner()
        await found.warm()
        return found

    first = asyncio.new_event_loop()
    old = first.run_until_complete(started())
    pid = old.server_pid
    assert pid is not None and not gone(pid)
    first.close()
    second = asyncio.new_event_loop()
    try:
        new = second.run_until_complete(started())
        assert new is not old and old.server_pid is None and gone(pid)
        assert first not in spawning._SPAWNERS
        new.stop()
    finally:
        second.close()


def test_stopping_a_killer_that_died_with_a_request_unread_raises_nothing():
    """Closing the pipe to a killer that died flushes what it never read into a broken pipe: `run` stops the killer
    it could not use and tries a new one, so its stop must not raise."""
    killers = Killers()
    killers.warm()
    process = killers._process
    process.kill()
    process.wait()
    process.stdin.write(b"123 456\n")  # buffered, not flushed: the close flushes it
    killers.stop()
    assert process.stdin.closed and process.stdout.closed and killers._process is None
