"""Where the CLI finds its server and token: flags, then TRAINMASTER_* environment, then the config file."""

import sys
from pathlib import Path
from typing import TypedDict

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from services.cli.client import HANDOVER_S

DEFAULT_URL = "http://127.0.0.1:8080"


def config_file() -> Path:
    return Path.home() / ".config" / "trainmaster" / "config.toml"


class CliSettings(BaseSettings):
    """TRAINMASTER_URL, TRAINMASTER_TOKEN, TRAINMASTER_PROJECT; or url/token/project in the config file."""

    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore", env_ignore_empty=True)
    url: str = Field(DEFAULT_URL, description="The API's base URL (several replicas: comma-separated).")
    token: str | None = Field(None, description="A bearer token (tm_...).")
    project: str | None = Field(None, description="The project jobs go to; else the token's only project.")
    handover_s: float = Field(
        HANDOVER_S,
        ge=0,
        description="How long to keep trying while no replica answers (or each says 503) before giving up.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The flags, then the environment, then the config file (no .env file, no secrets directory)."""
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_file())


class Flags(TypedDict, total=False):
    """The flags that were given (one not given is absent: None would win over the environment and the file)."""

    url: str
    token: str
    project: str


def load(*, url: str | None = None, token: str | None = None, project: str | None = None) -> CliSettings:
    """Settings with the flags that were given winning over everything else."""
    flags: Flags = {}
    if url is not None:
        flags["url"] = url
    if token is not None:
        flags["token"] = token
    if project is not None:
        flags["project"] = project
    settings = CliSettings(**flags)
    warn_if_shared(config_file())
    return settings


def warn_if_shared(path: Path) -> None:
    """Said on stderr: a config file others on the machine may read, a token in it (ssh's rule for its keys)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & 0o077 and "token" in path.read_text(errors="replace"):
        print(
            f"trainmaster: {path} holds a token and others may read it (mode {mode & 0o777:o}): chmod 600 {path}",
            file=sys.stderr,
        )
