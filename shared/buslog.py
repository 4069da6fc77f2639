"""FastStream's supervisor lines at the level they deserve. A JetStream pull that times out before its stream answers
(at start, while the stream's leader is still being elected; nats-py raises asyncio's own TimeoutError there, which
FastStream 0.7's pull loop does not expect) is logged by FastStream as an ERROR with a traceback asking for an issue,
though its subscriber simply retries: here it is one INFO line. Its "callback ... is being executed" chatter, logged at
every restart of one of its tasks, goes to DEBUG. Every other error stays as FastStream logs it."""

import logging
import re

ACCESS_LOGGER = "faststream.access.nats"  # where FastStream's NATS broker logs its subscribers' tasks
RETRYING = re.compile(r"^(?P<task>\S+) raised an exception, retrying\.\.\.")
CALLBACK = re.compile(r"^callback for \S+ is being executed\.\.\.$")
NATS_PULL = ("nats/js/client.py", "_fetch_n")  # the frame that raised: a pull subscription's fetch


def expected_pull_timeout(exc: BaseException | None) -> bool:
    """A bare TimeoutError raised by nats-py's pull fetch (nothing else: a real failure keeps its traceback)."""
    if type(exc) is not TimeoutError or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return code.co_filename.replace("\\", "/").endswith(NATS_PULL[0]) and code.co_name == NATS_PULL[1]


class ExpectedBusWaits(logging.Filter):
    """Rewrites FastStream's record of an expected pull timeout as INFO; drops its task-callback chatter unless
    DEBUG is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if CALLBACK.match(message):
            return _demote(record, logging.DEBUG)
        found = RETRYING.match(message)
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno == logging.ERROR and found and expected_pull_timeout(exc):
            record.msg = (
                f"{found['task']}: a JetStream pull timed out before its stream answered (its leader is "
                f"being elected, or the server is busy); the subscriber retries"
            )
            record.args, record.exc_info, record.exc_text = (), None, None
            return _demote(record, logging.INFO)
        return True


def _demote(record: logging.LogRecord, level: int) -> bool:
    record.levelno, record.levelname = level, logging.getLevelName(level)
    return logging.getLogger(record.name).isEnabledFor(level)


def quiet_expected_bus_waits() -> None:
    """Install the filter on FastStream's NATS access logger (once)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, ExpectedBusWaits) for f in logger.filters):
        logger.addFilter(ExpectedBusWaits())
