"""Every process of the platform (services, agent, minter, CLI) starts by importing this package."""

from shared.deferred import DEFERRED, defer

defer(*DEFERRED)
