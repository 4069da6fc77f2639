"""Where on-demand nodes come from: `local-process` (an agent on this machine, for `make run` and tests), `ec2`
(AWS, on-demand and spot) and `kubernetes` (a Pod per node). Cloud providers import their clients lazily, so the
core runs without them installed."""

from services.placement.providers.base import Provider, Unavailable, node_entry
from services.placement.providers.credentials import NodeCredentials
from services.placement.providers.local_process import RELEASE_GRACE_S, LocalProcessProvider, stop_group

__all__ = [
    "Provider",
    "Unavailable",
    "node_entry",
    "NodeCredentials",
    "LocalProcessProvider",
    "RELEASE_GRACE_S",
    "stop_group",
]
