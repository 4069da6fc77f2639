"""Time in one place, so that tests and the simulator can reason about it."""

from datetime import UTC, datetime


def utcnow() -> datetime:
    """The current time, timezone-aware UTC, truncated to milliseconds as BSON stores it."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def as_utc(value: datetime) -> datetime:
    """A datetime from the database (naive or aware) as aware UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
