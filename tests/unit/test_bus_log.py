"""FastStream's supervisor lines: a JetStream pull timing out inside nats-py while a stream has no leader yet is an
INFO line without traceback; any other failure of a subscriber's task stays an ERROR with its traceback."""

import logging

import nats.js.client
import pytest

from shared.buslog import ACCESS_LOGGER, ExpectedBusWaits, quiet_expected_bus_waits

# FastStream 0.7's own words (faststream/_internal/endpoint/subscriber/supervisor.py)
RETRYING = (
    "Task-29 raised an exception, retrying...\nIf this behavior causes issues, you can disable it via setting "
    "the FASTSTREAM_SUPERVISOR_DISABLED env to 1. Also, please consider opening issue on the repository: "
    "https://github.com/ag2ai/faststream."
)


def raised_in(filename: str, function: str, exc: BaseException) -> BaseException:
    """`exc` as raised by `function` of `filename` (where nats-py's pull fetch raises it)."""
    scope: dict = {}
    exec(compile(f"def {function}(exc):\n    raise exc\n", filename, "exec"), scope)
    try:
        scope[function](exc)
    except BaseException as raised:  # noqa: BLE001
        return raised
    raise AssertionError("not raised")


@pytest.fixture
def access_log(caplog):
    quiet_expected_bus_waits()
    quiet_expected_bus_waits()  # once is enough, twice changes nothing
    logger = logging.getLogger(ACCESS_LOGGER)
    assert sum(isinstance(f, ExpectedBusWaits) for f in logger.filters) == 1  # FastStream adds its own per broker
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # as FastStream sets it: its records reach its own handler only
    yield logger, caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)
    logger.propagate = propagate


def test_a_pull_that_times_out_in_nats_while_the_stream_elects_its_leader_is_one_info_line(access_log):
    logger, caplog = access_log
    logger.log(logging.ERROR, RETRYING, exc_info=raised_in(nats.js.client.__file__, "_fetch_n", TimeoutError()))
    [record] = caplog.records
    assert (record.levelno, record.exc_info) == (logging.INFO, None)  # levelname: FastStream colours it in place
    assert "Task-29: a JetStream pull timed out before its stream answered" in caplog.text
    assert "Traceback" not in caplog.text and "opening issue" not in caplog.text


@pytest.mark.parametrize(
    "exc",
    [
        raised_in(nats.js.client.__file__, "_fetch_n", ConnectionError("refused")),
        raised_in(__file__, "our_handler", TimeoutError()),
    ],
)
def test_any_other_failure_of_a_subscribers_task_stays_an_error_with_its_traceback(access_log, exc):
    logger, caplog = access_log
    logger.log(logging.ERROR, RETRYING, exc_info=exc)
    [record] = caplog.records
    assert record.levelno == logging.ERROR and "Traceback" in caplog.text and "opening issue" in caplog.text


def test_the_supervisors_callback_chatter_shows_only_at_debug(access_log):
    logger, caplog = access_log
    logger.log(logging.INFO, "callback for Task-56 is being executed...")
    assert caplog.records == []
    logger.setLevel(logging.DEBUG)
    logger.log(logging.INFO, "callback for Task-57 is being executed...")
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
