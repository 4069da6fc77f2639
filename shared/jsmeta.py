"""What the bus server says of a JetStream message it delivered: facts of its own, not the publisher's word."""

from datetime import datetime
from typing import Any


def stored_at(message: Any) -> datetime | None:
    """When the bus server stored a JetStream message (its own clock, not the publisher's word); None for one
    without JetStream metadata (an in-memory test broker's)."""
    try:
        stamp = message.raw_message.metadata.timestamp
    except Exception:  # noqa: BLE001 - anything without JetStream metadata has no stored time
        return None
    return stamp if isinstance(stamp, datetime) and stamp.tzinfo else None


def delivery_facts(message: Any) -> tuple[int, datetime] | None:
    """How many times the server has delivered a JetStream message and when it stored it (its clock); None for a
    message without JetStream metadata."""
    if (stored := stored_at(message)) is None:
        return None
    try:
        return int(message.raw_message.metadata.num_delivered), stored
    except (AttributeError, TypeError, ValueError):
        return None
