"""An agent's heartbeat interval: its own configured one, slowed to what the monitor announces for a large fleet
(`NodeCadence`, services/monitor/cadence.py)."""

import logging

from pydantic import ValidationError

from shared.events import NodeCadence

log = logging.getLogger(__name__)


class Pace:
    def __init__(self, floor_s: float) -> None:
        if floor_s <= 0:
            raise ValueError(f"heartbeat interval must be > 0, not {floor_s}")
        self.floor_s = floor_s
        self.interval_s = floor_s
        self.timeout_s: float | None = None  # the node timeout last announced with it

    def heard(self, data: bytes) -> bool:
        """An announcement as it came off the bus; True when the interval changed. Never below the floor; an
        announcement that does not parse changes nothing."""
        try:
            cadence = NodeCadence.model_validate_json(data)
        except ValidationError as exc:
            log.warning("heartbeat cadence ignored: %s", exc.errors(include_url=False, include_input=False))
            return False
        interval = max(self.floor_s, cadence.interval_s)
        self.timeout_s = cadence.timeout_s
        if interval == self.interval_s:
            return False
        log.info("heartbeat every %.1f s (was %.1f s), as the monitor asks", interval, self.interval_s)
        self.interval_s = interval
        return True
