"""What placement may ask the minter (`services.minter`), the one process that holds the keys which sign bus users
and re-issue the account: an identity for one rented node's agent, the two-minute identity that creates that node's
command consumer, and the revocation of every identity it minted for a node. Core NATS requests; the minter answers
placement (and the operator) only."""

from pydantic import BaseModel, ConfigDict, Field

from shared.buscreds import NAME

SUBJECT = "tm.rpc.minter.{action}"
MINT_AGENT = SUBJECT.format(action="agent")
MINT_CONSUMER_MAKER = SUBJECT.format(action="consumer-maker")
REVOKE_NODE = SUBJECT.format(action="revoke")
SUBJECTS = (MINT_AGENT, MINT_CONSUMER_MAKER, REVOKE_NODE)
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


class MinterAnswer(BaseModel):
    """The minter's answer: the identity's `.creds` text and public key, or why it refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    creds: str = Field("", description="The minted identity's `.creds` (user JWT and seed); empty for a revocation.")
    user: str = Field("", description="Its public key.")
    error: str = Field("", description="Why the request was refused; empty when it was done.")
