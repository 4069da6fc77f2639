"""Settings common to every trainmaster process, read once at start from TRAINMASTER_* variables."""

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MONGO_URL = "mongodb://127.0.0.1:27017"


def database_name(service: str) -> str:
    """The database a service owns (its collections, nobody else's), on whichever server holds it."""
    return f"trainmaster_{service}"


def own_mongo_url(service: str) -> Any:
    """A service's `mongo_url` field: TRAINMASTER_<SERVICE>_MONGO_URL, else the common MONGO_URL (one deployment
    serving every service, each in its own database)."""
    own = f"TRAINMASTER_{service.upper()}_MONGO_URL"
    return Field(
        DEFAULT_MONGO_URL,
        validation_alias=AliasChoices(own, "MONGO_URL"),
        description=f"The {service}'s database server: {own}, else MONGO_URL.",
    )


def own_mongo_db(service: str) -> Any:
    """A service's `mongo_db` field: its own database (TRAINMASTER_<SERVICE>_MONGO_DB renames it)."""
    return Field(
        database_name(service),
        validation_alias=AliasChoices(f"TRAINMASTER_{service.upper()}_MONGO_DB", "TRAINMASTER_MONGO_DB"),
        description=f"The {service}'s own database: its collections, nobody else's.",
    )


class CommonSettings(BaseSettings):
    """What every service needs: where the bus and the database are, where data lives."""

    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore", populate_by_name=True)

    nats_url: str = Field(
        "nats://127.0.0.1:4222",
        description="NATS server with JetStream enabled (several servers of one cluster: comma-separated URLs).",
    )
    nats_creds: Path | None = Field(
        None,
        description="This process's own bus credentials (`.creds`: user JWT and "
        "seed); the server refuses anonymous clients. `make run` gives each its own.",
    )
    nats_ca_file: Path | None = Field(None, description="CA of the NATS server's certificate, for a tls:// URL.")
    leader_lease: bool = Field(
        False,
        description="Run as one of several replicas: a service that must act once "
        "(placement, monitor, billing, estimator) waits for its leader lease before it starts "
        "and exits when it loses it (docs/operations.md).",
    )
    mongo_url: str = Field(
        DEFAULT_MONGO_URL,
        validation_alias="MONGO_URL",
        description="MongoDB (or MongoDB-wire) server; MONGO_URL, as docker-compose sets it.",
    )
    mongo_db: str = Field("trainmaster", description="Database name (a service's settings name its own).")
    data_dir: Path = Field(Path(".trainmaster"), description="Local state: logs, tokens, the embedded database.")
    heartbeat_interval_s: float = Field(2.0, gt=0, description="How often agents report that they are alive.")
    node_timeout_s: float = Field(10.0, gt=0, description="Silence after which a node is declared lost.")
    log_level: str = Field("INFO")
