"""What the minter grants, decided over its state (`shared.buscreds.Minter`) without I/O: one identity with the
agent role for each rented node (never a second, never again once revoked), that node's two-minute consumer maker
while it has one, the revocation of what it minted for a node; within a cap on live identities and a rate. Where
the cluster rents from clouds the minter can ask, each node is checked against the one provider that rented it."""

from dataclasses import dataclass

from shared import busroles
from shared.buscreds import NAME, Minter, new_seed, public_key
from shared.minting import CONSUMER_MAKER_TTL_S, MintAgent, MintConsumerMaker, RekeyAgent, RevokeNode
from services.minter.bucket import TokenBucket
from services.minter.retired import is_retired, retire


class Refused(ValueError):
    """A request the minter does not grant (its reason goes back to the requester)."""


@dataclass
class Limits:
    """What the minter grants at most: the static nodes it never mints for, live rented identities, mints a minute."""

    static: frozenset[str]
    max_rented_nodes: int
    bucket: TokenBucket
    max_revocations: int = 50_000  # ~70 bytes each in the account JWT, whose update must fit NATS's max_payload
    providers: frozenset[str] = frozenset()  # the providers it asks whether a node was launched (none: it asks none)
    per_signer: int = 500  # rented agents a rental signer signs before the next; carried: per_signer x (live + 1)


def rental_signer(minter: Minter, *, per_signer: int) -> str:
    """The signing key of the next rented agent: the newest rental signer, or a new one once it has signed
    `per_signer` (a signer's revocations are dropped with it once none of its users is live: `Minter.revoke`)."""
    current = minter.rental_signers[-1] if minter.rental_signers else None
    signed = sum(1 for signer in minter.signed_by.values() if current and signer == public_key(current))
    if current is None or signed >= per_signer:
        current = new_seed("account")
        minter.rental_signers.append(current)
    return current


def provider_of(named: str | None, *, providers: frozenset[str]) -> str | None:
    """The provider a new node is checked against: the one the request names, among those the minter asks (where it
    asks one, the request may leave it out); None where it asks none. A node no provider can vouch for gets no
    identity: "either says yes" would let a Pod labelled with an EC2 node's id keep that node's identity."""
    if not providers:
        return None
    if named is None and len(providers) == 1:
        return next(iter(providers))
    if named not in providers:
        raise Refused(
            f"provider {named!r}: the cluster rents from {', '.join(sorted(providers))}, and a node is checked "
            "against the provider that rented it (the request names it)"
        )
    return named


def checked_by(minter: Minter, node_id: str, *, providers: frozenset[str]) -> str | None:
    """The provider a live node is checked against: the one recorded at its mint; a node minted before the minter
    recorded it, EC2 (the only provider it asked then) where configured, else the only one; None where it asks none."""
    if not providers:
        return None
    recorded = minter.rented_from.get(node_id)
    if recorded is not None:
        return recorded  # one no longer configured vouches for nothing: the node is revoked
    return "ec2" if "ec2" in providers else min(providers)


def rented(node_id: str, *, static: frozenset[str]) -> str:
    """The node id, if it can be a rented node's: one subject token, and no node of the cluster file (whose agents
    get their identities from the stack; an identity for one would let its holder speak for that node)."""
    if not NAME.match(node_id):
        raise Refused(f"node id {node_id!r} is not one subject token ({NAME.pattern})")
    if node_id in static:
        raise Refused(f"{node_id} is a node of the cluster file, not a rented one")
    return node_id


def take_token(limits: Limits, *, monotonic: float) -> None:
    """One mint off the rate limit, or refused naming it."""
    if not limits.bucket.take(monotonic):
        raise Refused(
            f"rate limit: at most {limits.bucket.capacity} mints at once, then {limits.bucket.per_minute:g} a minute "
            "(TRAINMASTER_MINT_BURST, TRAINMASTER_MINTS_PER_MINUTE)"
        )


def mint_agent(minter: Minter, request: MintAgent, *, limits: Limits, now: float, monotonic: float) -> tuple[str, str]:
    """A new user with the agent role for the node (public key, `.creds`), recorded for the node's revocation. A
    node has one: a second beside a live one would read its commands beside its agent, and
    one after its revocation would take its place."""
    node_id = rented(request.node_id, static=limits.static)
    provider = provider_of(request.provider, providers=limits.providers)
    if minter.minted.get(node_id):
        raise Refused(f"{node_id} has a live agent identity already: one per node")
    if is_retired(minter, node_id):
        raise Refused(f"{node_id}'s agent identity was revoked: a node id gets one identity, never another")
    if (carried := len(minter.revocations) + len(minter.static.revoked)) >= limits.max_revocations:
        raise Refused(
            f"the account carries {carried} revocations, at most {limits.max_revocations} "
            "(TRAINMASTER_MAX_REVOCATIONS): a new identity could not be revoked once the account outgrows what the "
            "server takes"
        )
    live = sum(1 for users in minter.minted.values() if users)
    if live >= limits.max_rented_nodes:
        raise Refused(
            f"cap: {live} rented nodes have live identities, at most {limits.max_rented_nodes} "
            "(TRAINMASTER_MAX_RENTED_NODES)"
        )
    take_token(limits, monotonic=monotonic)
    signer = rental_signer(minter, per_signer=limits.per_signer)
    # a start identity (user data, a Secret, traded at once): no secrets of its node's tasks (`busroles.agent`)
    permissions = busroles.agent(node_id, secrets=False)
    user, creds = minter.mint(name=f"agent-{node_id}", permissions=permissions, signer_seed=signer)
    minter.minted[node_id] = [user]
    minter.minted_at[node_id] = int(now)
    if provider is not None:
        minter.rented_from[node_id] = provider
    return user, creds


class Revoked(Refused):
    """The node's identity is gone, or goes now: its agent stops."""


class Compromised(Revoked):
    """A node's start identity traded twice for different keys: someone else holds it (the node is revoked)."""


def rekey_agent(minter: Minter, request: RekeyAgent, *, asked_for: str, limits: Limits, now: float) -> str:
    """The JWT of the key a rented node's agent made itself (the node's identity from now on, signed by the signer
    of the one it replaces; those it replaces revoked once the agent confirms, past the hold: `replaced_due`).
    For the node whose subject the request came on (only that node's start identity may publish there), never for a
    key the minter knows. Asked again for the same key (the answer lost), the same identity again; for another key,
    `Compromised`. Not charged to the mint rate: once per node, within the cap on live nodes."""
    node_id = rented(request.node_id, static=limits.static)
    if node_id != asked_for:
        raise Refused(f"a rekey of {node_id} asked on {asked_for}'s subject")
    users = minter.minted.get(node_id)
    if not users:
        raise Revoked(f"{node_id} has no live agent identity to replace")
    if node_id in minter.rekeyed and request.user != users[-1]:
        raise Compromised(
            f"{node_id}'s start identity was traded for another key already: someone else holds it, and the node is "
            "revoked"
        )
    if node_id not in minter.rekeyed and known_key(minter, request.user):
        raise Refused("a key the minter signed or revoked before: the agent makes a new one")
    signer = minter.signed_by.get(users[0])
    seed = next((s for s in minter.rental_signers if public_key(s) == signer), None)
    token = minter.sign(
        name=f"agent-{node_id}", permissions=busroles.agent(node_id, own_key=True), user=request.user, signer_seed=seed
    )
    if node_id not in minter.rekeyed:  # else its answer was lost: signed again, nothing else changes
        minter.minted[node_id] = [*users, request.user]
        minter.rekeyed[node_id] = int(now)
    return token


def known_key(minter: Minter, user: str) -> bool:
    """Whether the minter signed, revoked or carries `user` (any node's, a static identity's revocation)."""
    minted = (u for users in minter.minted.values() for u in users)
    return user in minter.revocations or user in minter.signed_by or user in minter.static.revoked or user in minted


def confirm_rekey(minter: Minter, node_id: str, *, asked_for: str, static: frozenset[str], now: float) -> None:
    """Record that the node's agent is connected as its own key (only that key may publish the confirmation): its
    start identity goes at the next `replaced_due` past the hold."""
    node_id = rented(node_id, static=static)
    if node_id != asked_for:
        raise Refused(f"a confirmation for {node_id} said on {asked_for}'s subject")
    if node_id not in minter.rekeyed:
        raise Refused(f"{node_id} traded no start identity")
    minter.confirmed.setdefault(node_id, int(now))


def drop_replaced(minter: Minter, node_id: str, users: list[str]) -> str | None:
    """Revoke those of `users` (identities a rekey replaced) the node still has; the account JWT to push, None where
    none was left (the node released meanwhile: revoked with it)."""
    live = minter.minted.get(node_id, [])
    gone = [user for user in users if user in live]
    if not gone:
        return None
    minter.minted[node_id] = [user for user in live if user not in gone]
    return minter.revoke(*gone)


def replaced_due(
    minter: Minter, *, now: float, hold_s: float, unconfirmed_s: float, since: float = 0.0
) -> dict[str, list[str]]:
    """By node, the identities its trade replaced that may go now (every one of the node's but its newest): only
    `hold_s` after the node's mint (a second trade within it is still seen), and once its agent confirmed, or
    `unconfirmed_s` after the trade (counted from `since`, the minter's own start, where later: an answer lost
    while it was away is asked for again once it is back)."""
    due = {}
    for node_id, at in minter.rekeyed.items():
        users = minter.minted.get(node_id, [])
        if len(users) < 2 or minter.minted_at.get(node_id, 0) > now - hold_s:
            continue
        if node_id in minter.confirmed or max(at, since) <= now - unconfirmed_s:
            due[node_id] = users[:-1]
    return due


def may_make_consumer(minter: Minter, request: MintConsumerMaker, *, limits: Limits, monotonic: float) -> str:
    """The node id, if it may have a consumer maker: only a node with a live agent identity (no consumer for a node
    no agent can read), within the rate."""
    node_id = rented(request.node_id, static=limits.static)
    if not minter.minted.get(node_id):
        raise Refused(f"{node_id} has no live agent identity: no consumer maker")
    take_token(limits, monotonic=monotonic)
    return node_id


def mint_consumer_maker(minter: Minter, node_id: str, *, now: float) -> tuple[str, str]:
    """The identity that may create the node's command consumer (`may_make_consumer` first), refused by the server
    `CONSUMER_MAKER_TTL_S` after `now`."""
    return minter.mint(
        name=f"consumer-maker-{node_id}",
        permissions=busroles.consumer_maker(node_id),
        expires_at=int(now) + CONSUMER_MAKER_TTL_S,
    )


def carrier(node_id: str, machines: set[str], *, pinned: str | None) -> str | None:
    """Of the machines its provider lists carrying the node's id, the one that vouches for it: the one pinned at its
    first check, whatever else carries the id (anyone who may create Pods or launch tagged instances can make
    another after the real one is gone); before a pin, the only one (several: refused, ambiguous). None: none
    vouches (yet)."""
    if pinned is not None:
        return pinned if pinned in machines else None
    if len(machines) > 1:
        raise Refused(f"{node_id} is carried by {len(machines)} machines ({', '.join(sorted(machines))}): ambiguous")
    return next(iter(machines), None)


def pin(minter: Minter, node_id: str, machine: str) -> bool:
    """Pin the node to the machine that carried it at its first check (True: newly); refused where another was
    pinned meanwhile."""
    pinned = minter.machine_of.get(node_id)
    if pinned is None:
        minter.machine_of[node_id] = machine
        return True
    if pinned != machine:
        raise Refused(f"{node_id} is pinned to {pinned}, not {machine}")
    return False


def unlaunched(
    minter: Minter,
    *,
    launched: dict[str, dict[str, set[str]]] | None,
    now: float,
    grace_s: float,
    providers: frozenset[str],
) -> dict[str, list[str]]:
    """By the provider each is checked against: the nodes with a live identity minted over `grace_s` before `now`
    (an older data dir's: any time) that no launched machine of that provider vouches for (`carrier`: once pinned,
    its own machine only; before, any) (`launched`: provider -> node id -> machine ids; None before the clouds were
    asked, so every one that is due). None where the minter asks no provider."""
    due: dict[str, list[str]] = {}
    for node_id in sorted(n for n, users in minter.minted.items() if users):
        provider = checked_by(minter, node_id, providers=providers)
        if provider is None or minter.minted_at.get(node_id, 0) > now - grace_s:
            continue
        machines = set() if launched is None else launched.get(provider, {}).get(node_id, set())
        pinned = minter.machine_of.get(node_id)
        if not machines or (pinned is not None and pinned not in machines):
            due.setdefault(provider, []).append(node_id)
    return due


def pin_found(
    minter: Minter, *, launched: dict[str, dict[str, set[str]]], providers: frozenset[str], among: set[str]
) -> list[str]:
    """Pin each live unpinned node `among` those asked about (one of a file written before pins, never checked since)
    that exactly one machine of its provider carries (`launched`: provider -> node id -> machine ids); the nodes
    pinned."""
    pinned = []
    for node_id in sorted(n for n in among if minter.minted.get(n) and n not in minter.machine_of):
        provider = checked_by(minter, node_id, providers=providers)
        machines = launched.get(provider, {}).get(node_id, set()) if provider is not None else set()
        if len(machines) == 1:
            minter.machine_of[node_id] = next(iter(machines))
            pinned.append(node_id)
    return pinned


def revoke_node(minter: Minter, request: RevokeNode) -> str:
    """Revoke every user minted for the node (none: nothing new); the account JWT to push, re-issued either way so
    that a push that failed before is made again. A node revoked is retired: never minted for again."""
    users = minter.minted.pop(request.node_id, [])
    minter.minted_at.pop(request.node_id, None)
    minter.rekeyed.pop(request.node_id, None)
    minter.confirmed.pop(request.node_id, None)
    minter.rented_from.pop(request.node_id, None)
    minter.machine_of.pop(request.node_id, None)
    account = minter.revoke(*users)
    if users:
        retire(minter, request.node_id, at=minter.issued_at)
    return account
