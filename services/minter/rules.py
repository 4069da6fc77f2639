"""What the minter grants, decided over its state (`shared.buscreds.Minter`) without I/O: an identity with the agent
role of one rented node, that node's two-minute consumer maker, the revocation of what it minted for a node."""

from shared import busroles
from shared.buscreds import NAME, Minter
from shared.minting import CONSUMER_MAKER_TTL_S, MintAgent, MintConsumerMaker, RevokeNode


class Refused(ValueError):
    """A request the minter does not grant (its reason goes back to the requester)."""


def rented(node_id: str, *, static: frozenset[str]) -> str:
    """The node id, if it can be a rented node's: one subject token, and no node of the cluster file (whose agents
    get their identities from the stack; an identity for one would let its holder speak for that node)."""
    if not NAME.match(node_id):
        raise Refused(f"node id {node_id!r} is not one subject token ({NAME.pattern})")
    if node_id in static:
        raise Refused(f"{node_id} is a node of the cluster file, not a rented one")
    return node_id


def mint_agent(minter: Minter, request: MintAgent, *, static: frozenset[str]) -> tuple[str, str]:
    """A new user with the agent role for the node (public key, `.creds`), recorded for the node's revocation."""
    node_id = rented(request.node_id, static=static)
    user, creds = minter.mint(name=f"agent-{node_id}", permissions=busroles.agent(node_id))
    minter.minted.setdefault(node_id, []).append(user)
    return user, creds


def mint_consumer_maker(
    minter: Minter, request: MintConsumerMaker, *, static: frozenset[str], now: float
) -> tuple[str, str]:
    """The identity that may create the node's command consumer, refused by the server `CONSUMER_MAKER_TTL_S` after
    `now`."""
    node_id = rented(request.node_id, static=static)
    return minter.mint(
        name=f"consumer-maker-{node_id}",
        permissions=busroles.consumer_maker(node_id),
        expires_at=int(now) + CONSUMER_MAKER_TTL_S,
    )


def revoke_node(minter: Minter, request: RevokeNode) -> str:
    """Revoke every user minted for the node (none: nothing new); the account JWT to push, re-issued either way so
    that a push that failed before is made again."""
    return minter.revoke(*minter.minted.pop(request.node_id, []))
