"""The stack's settings (`make run`, the tests' stacks, and the operator's bus declaration read them alike)."""

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.bus import LOG_STREAM_MAX_BYTES


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore")

    data_dir: Path = Path(".trainmaster")
    nats_port: int = 4222
    nats_servers: int = Field(
        1,
        description="NATS servers started here: 3 make a JetStream cluster on "
        "loopback (clients on nats_port, +1, +2; routes on nats_port+10, +11, +12) "
        "whose streams keep 3 copies, so any one server may fail.",
    )
    stream_replicas: int | None = Field(
        None,
        ge=1,
        le=5,
        description="Copies of each stream; default: one per server started here (1 with an external NATS).",
    )
    log_stream_max_bytes: int = Field(
        LOG_STREAM_MAX_BYTES,
        ge=1024**2,
        description="Bytes of output the bus keeps at most (the stream TM_LOGS, a week at most), the oldest going "
        "first; each job's stored output has its own cap besides.",
    )
    bus_prune: bool = Field(
        False,
        description="The bus's declaration deletes every consumer it does not declare on trainmaster's streams (a "
        "newer version's after a rollback, an operator's); else only those no one may keep (push consumers, and "
        "under a name an agent may read), logging the others.",
    )
    api_port: int = 8080
    api_host: str = "127.0.0.1"
    mongo_url: str | None = Field(
        None,
        validation_alias="MONGO_URL",
        description="External MongoDB (every service "
        "in a database of its own there); else an embedded server per service.",
    )
    nats_url: str | None = Field(
        None,
        description="External NATS (JetStream on, configured with the auth block "
        "`python -m services.stack.identities` writes); else one is started here.",
    )
    nats_tls_cert: Path | None = Field(None, description="Server certificate: the NATS started here speaks TLS.")
    nats_tls_key: Path | None = Field(None, description="Its private key.")
    nats_ca_file: Path | None = Field(None, description="CA that signed the server's certificate (clients check).")
    cluster_file: Path = Path("cluster.toml")
    admin_token: str | None = None
    # the keys that seal jobs' secrets (the submitter's alone; unset: a key file in the data directory)
    secrets_keys: str | None = None
    heartbeat_interval_s: float = 2.0
    node_timeout_s: float = 10.0
    checkpoint_sync_s: float = 5.0
    checkpoint_url: str | None = None
    log_level: str = "INFO"
    fork_server: bool = Field(
        True,
        description="The services, agents and embedded databases are forked from one process that imported their "
        "libraries once (services/stack/forkserver.py: ~0.6 s of CPU less a process); false: each is a Python "
        "of its own (its command line shows it in `ps`).",
    )
    service_replicas: int = Field(
        1,
        description="Processes of each service: 2 run a second of each (the second API "
        "on api_port + 1); of placement, monitor, billing and the estimator one leads "
        "(a leader lease on the bus) and the other takes over when it dies.",
    )

    @field_validator("service_replicas")
    @classmethod
    def _one_or_two(cls, value: int) -> int:
        if value not in (1, 2):
            raise ValueError("service_replicas must be 1 or 2")
        return value

    @field_validator("nats_servers")
    @classmethod
    def _one_or_three(cls, value: int) -> int:
        if value not in (1, 3):  # a cluster must keep a majority when one server goes: 3
            raise ValueError("nats_servers must be 1 (one server) or 3 (a cluster that survives the loss of one)")
        return value
