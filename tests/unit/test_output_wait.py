"""A finished status whose tasks' final output is not stored yet comes back to be looked at again: soon at first
(output usually follows its status within a moment), then as long again as the status is old, never later than
OUTPUT_RETRY_MAX_S, until the hold (OUTPUT_HOLD_S) lets it be shown anyway. Each look is a count of the task's
chunks on the database: it came back every 0.2 s, 75 looks in the hold for each rank whose output never came."""

from datetime import timedelta

import pytest
from faststream.exceptions import NackMessage

from shared.clock import utcnow
from services.submitter.handlers import OUTPUT_RETRY_MAX_S, OUTPUT_RETRY_S, on_status
from services.submitter.logs import OUTPUT_HOLD_S
from tests.unit.test_final_output import chunk, completed, repository


async def test_a_status_waiting_for_output_that_never_comes_is_looked_at_a_bounded_number_of_times():
    repo = repository()
    looks, waits, waited, shown = 0, [], 0.0, False
    count = repo.output.complete

    async def counted(*args, **kwargs) -> bool:
        nonlocal looks
        looks += 1
        return await count(*args, **kwargs)

    repo.output.complete = counted  # type: ignore[method-assign]
    for _ in range(1, 100):
        status = completed(at=utcnow() - timedelta(seconds=waited))  # as old as the waits so far make it
        try:
            await on_status(status, repo)
        except NackMessage as nack:
            waits.append(nack.extra_options["delay"])
            waited += waits[-1]
            continue
        shown = True
        break
    assert shown and waited > OUTPUT_HOLD_S  # shown without its output once the hold passed, as before
    assert waits[0] == pytest.approx(OUTPUT_RETRY_S, abs=0.05)  # the status is a moment old when it is looked at
    assert waits == sorted(waits) and max(waits) == OUTPUT_RETRY_MAX_S
    assert looks == len(waits) + 1 == 9


async def test_output_that_arrives_is_seen_at_the_next_look():
    repo = repository()
    with pytest.raises(NackMessage):
        await on_status(completed(), repo)
    await repo.output.add(chunk(0, "the end", last=True))
    await on_status(completed(), repo)  # stored now: applied, not sent back


async def test_a_fresh_status_delivered_again_for_another_reason_is_looked_at_again_soon():
    """Its deliveries are no measure of its wait for output: one sent back for a database blip (or redelivered
    after a restart, or past its ack wait) came back 3.2 s later at its 5th delivery, though just made."""
    repo = repository()
    with pytest.raises(NackMessage) as soon:
        await on_status(completed(at=utcnow()), repo)
    with pytest.raises(NackMessage) as later:
        await on_status(completed(at=utcnow() - timedelta(seconds=1)), repo)
    assert soon.value.extra_options["delay"] == pytest.approx(OUTPUT_RETRY_S, abs=0.05)
    assert later.value.extra_options["delay"] == pytest.approx(OUTPUT_RETRY_S + 1, abs=0.05)
