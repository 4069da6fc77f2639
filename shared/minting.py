"""What placement may ask the minter (`services.minter`), the one process that holds the keys which sign bus users
and re-issue the account: an identity for one rented node's agent, the two-minute identity that creates that node's
command consumer, and the revocation of every identity it minted for a node; and what a rented node's agent may ask
it: once, an identity for a key the agent made itself, in place of the one its node was started with (`RekeyAgent`).
Core NATS requests; the minter answers placement, the operator, and each agent for its own node only."""

from pydantic import BaseModel, ConfigDict, Field

from shared.buscreds import NAME

SUBJECT = "tm.rpc.minter.{action}"
MINT_AGENT = SUBJECT.format(action="agent")
MINT_CONSUMER_MAKER = SUBJECT.format(action="consumer-maker")
REVOKE_NODE = SUBJECT.format(action="revoke")
SUBJECTS = (MINT_AGENT, MINT_CONSUMER_MAKER, REVOKE_NODE)
REKEY_AGENT = SUBJECT.format(action="rekey") + ".{node_id}"  # asked by that node's start identity only
REKEYED_AGENT = SUBJECT.format(action="rekeyed") + ".{node_id}"  # said by that node's own key only, once connected
REKEY_SUBJECTS = (REKEY_AGENT.format(node_id="*"), REKEYED_AGENT.format(node_id="*"))
REKEY_INBOX = "_INBOX_rekey.{node_id}"  # the minter's answers to a node's agent: the only agents' space it may write
# A node's start identity stays good until REKEY_HOLD_S after its mint, whatever was traded: a trade for a second key
# within it (the thief's first, the agent's when it starts) is seen and revokes the node. Its agent must trade within
# it (its machine's boot and install included); past it, the start identity goes once the agent confirmed, or
# REKEY_REVOKE_AFTER_S after a trade never confirmed (counted from the minter's own start where that is later).
REKEY_HOLD_S = 1800.0
REKEY_REVOKE_AFTER_S = 3600.0
USER_KEY = r"^U[A-Z2-7]{55}$"  # a user's public nkey
CONSUMER_MAKER_TTL_S = 120  # the server refuses the identity that creates a node's command consumer after this


class ForNode(BaseModel):
    """A request about one rented node (never a static node of the cluster file: the minter refuses those)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: str = Field(pattern=NAME.pattern, description="One subject token.", examples=["od-3f2a"])


class MintAgent(ForNode):
    """Mint a user with the agent role for this node (a key of its own, made by the minter)."""

    provider: str | None = Field(
        None,
        pattern=r"^[a-z0-9-]{1,32}$",
        description="The provider that rents the node: the minter checks it against that provider alone (where the "
        "cluster rents from one, it may be left out).",
        examples=["ec2", "kubernetes"],
    )


class MintConsumerMaker(ForNode):
    """Mint the identity that may create this node's command consumer, for `CONSUMER_MAKER_TTL_S`."""


class RevokeNode(ForNode):
    """Revoke every identity minted for this node and push the account to the server (idempotent)."""


class RekeyAgent(ForNode):
    """From a rented node's agent (its start identity, on `REKEY_AGENT`): an identity for the key it made itself
    (`user`), in place of the one its node was started with. That one travelled in the machine's user data (EC2:
    readable by any principal allowed `ec2:DescribeInstanceAttribute`, as long as the instance lives; Kubernetes: its
    Secret) and in placement's files. Asked again for the same key (an answer lost), the same identity is signed
    again; a trade to another key is a compromise (someone else holds the start identity): the node is revoked.
    The agent, connected as its own key, says so (`RekeyConfirmed` on `REKEYED_AGENT`); the start identity is
    revoked then, though never before `REKEY_HOLD_S` after its mint (else `REKEY_REVOKE_AFTER_S` after the trade)."""

    user: str = Field(pattern=USER_KEY, description="The public key of the agent's own user nkey.")


class RekeyConfirmed(ForNode):
    """From a rented node's agent, connected as its own key: the start identity may go."""


class MinterAnswer(BaseModel):
    """The minter's answer: the identity's `.creds` text and public key, or why it refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    creds: str = Field("", description="The minted identity's `.creds` (user JWT and seed); empty for a revocation.")
    jwt: str = Field("", description="A rekeyed agent's user JWT (its seed is the agent's own, never sent).")
    user: str = Field("", description="Its public key.")
    error: str = Field("", description="Why the request was refused; empty when it was done.")
    final: bool = Field(False, description="A refusal asking again will not change (not the minter's own failure).")
    revoked: bool = Field(False, description="A refusal because the node's identity is gone or goes now.")
