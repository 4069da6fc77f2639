"""When the monitor's sweeps can find anything (`services.monitor.dues`): from the states it writes, counted before
their writes land, and what its sweeps read; a write in flight while a sweep reads is never forgotten."""

from datetime import timedelta

from services.monitor.dues import UNKNOWN, Dues, due_at, hanging
from services.monitor.hangs import task_hung
from tests.factories import T0
from tests.unit.test_monitor_hangs import hung, running

LIMITED = running(max_duration_s=60)
DEADLINE = T0 + timedelta(seconds=60)


def test_a_state_is_due_at_its_deadline_while_it_runs_and_hanging_once_suspected():
    assert due_at(running()) is None and not hanging(running())
    assert due_at(LIMITED) == DEADLINE
    suspect, _ = task_hung(running(), hung(), now=T0)
    assert hanging(suspect) and due_at(suspect) is None


def test_both_sweeps_run_at_start_and_then_only_when_a_written_state_calls_for_them():
    dues = Dues()
    assert dues.next_due == UNKNOWN and dues.due(T0) and dues.may_hang
    dues.due_sweep_begins(T0)
    dues.due_swept(None)  # nothing stored is due, ever
    dues.hang_sweep_begins(T0)
    dues.hang_swept(False)
    assert not dues.due(T0 + timedelta(seconds=59)) and not dues.hang_due(T0 + timedelta(seconds=59))
    token = dues.begin()
    dues.writing(token, running())  # a job without a limit calls for nothing
    dues.end(token)
    assert dues.next_due is None and not dues.may_hang
    token = dues.begin()
    dues.writing(token, LIMITED)
    suspect, _ = task_hung(running(), hung(), now=T0)
    dues.writing(token, suspect)  # a retried write: each state it may have stored counts
    dues.end(token)
    assert not dues.due(DEADLINE - timedelta(seconds=1)) and dues.due(DEADLINE) and dues.may_hang


def test_a_write_in_flight_or_ended_while_a_sweep_reads_keeps_its_due():
    dues = Dues()
    in_flight = dues.begin()
    dues.writing(in_flight, LIMITED)  # its write may land after the sweep's read
    dues.due_sweep_begins(T0)
    ended = dues.begin()
    dues.writing(ended, running(max_duration_s=30))  # begun and ended while the sweep reads
    dues.end(ended)
    dues.due_swept(None)
    assert dues.next_due == T0 + timedelta(seconds=30)
    dues.due_sweep_begins(T0)
    dues.due_swept(None)
    assert dues.next_due == DEADLINE  # still in flight
    dues.end(in_flight)
    dues.due_sweep_begins(T0)
    dues.due_swept(T0 + timedelta(hours=1))  # landed before this sweep read: in what it read
    assert dues.next_due == T0 + timedelta(hours=1)


def test_a_hanging_state_written_while_the_hang_sweep_reads_keeps_it_running():
    dues = Dues()
    dues.hang_sweep_begins(T0)
    token = dues.begin()
    suspect, _ = task_hung(running(), hung(), now=T0)
    dues.writing(token, suspect)
    dues.end(token)
    dues.hang_swept(False)
    assert dues.may_hang
    dues.hang_sweep_begins(T0)
    dues.hang_swept(True)  # still hanging: it stays suspect
    assert dues.may_hang
    dues.hang_sweep_begins(T0)
    dues.hang_swept(False)
    assert not dues.may_hang
