"""A job's secrets (`Algorithm.secrets`): values that reach the task's environment and nothing else.

The submitter takes them out of the job at submission: the job stored and every event carry their names only
(`Algorithm.secret_names`; `shared.events.CarriedAlgorithm` refuses values), so no stream, no other service, no
`GET` and no project member sees them. The submitter keeps the values, sealed, beside the job until it ends (then
they are removed). A node's agent that is to start a task with secrets asks for them on its own node's subject
(`bus.RPC_SECRETS`, the only one its identity may publish to), and the submitter answers only into that node's
part of `bus.SECRETS_INBOX` (the only part the node may read), and only when placement put that attempt's rank
on that node, the attempt is the job's newest and the job has not ended: a node's word on which job it runs is
checked against placement's record, never believed."""

from pydantic import BaseModel, ConfigDict, Field

from shared.bus import SECRETS_INBOX
from shared.events import AttemptNo, Id, RankNo
from shared.jobs import MAX_SECRETS


class SecretsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0


class SecretsAnswer(BaseModel):
    """The values (by name), or why not: `final` when asking again will not change it (else the placement may not
    be read yet: ask again)."""

    values: dict[str, str] = Field(default_factory=dict, max_length=MAX_SECRETS)
    error: str = Field("", max_length=512)
    final: bool = False


def reply_space(node_id: str) -> str:
    """Where the submitter answers a node's agent: `_INBOX_secrets.<node>.` (followed by the asker's token)."""
    return f"{SECRETS_INBOX.format(node_id=node_id)}."
