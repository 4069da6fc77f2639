"""Where the CLI finds its server, token and project: flags, then environment, then the config file."""

from services.cli.client import HANDOVER_S
from services.cli.settings import DEFAULT_URL, load


def test_flags_win_over_environment_over_the_config_file(tmp_path, monkeypatch):
    config = tmp_path / ".config" / "trainmaster"
    config.mkdir(parents=True)
    (config / "config.toml").write_text('url = "http://file:1"\ntoken = "file-token"\nproject = "file-project"\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("TRAINMASTER_URL", "TRAINMASTER_TOKEN", "TRAINMASTER_PROJECT", "TRAINMASTER_HANDOVER_S"):
        monkeypatch.delenv(name, raising=False)
    assert load().model_dump() == {
        "url": "http://file:1",
        "token": "file-token",
        "project": "file-project",
        "handover_s": HANDOVER_S,
    }

    monkeypatch.setenv("TRAINMASTER_TOKEN", "env-token")
    monkeypatch.setenv("TRAINMASTER_PROJECT", "")  # empty is unset
    assert load().token == "env-token" and load().project == "file-project"
    assert load(token="flag-token", url=None).token == "flag-token"
    monkeypatch.setenv("TRAINMASTER_HANDOVER_S", "1")  # how long an unreachable server is tried (the e2e test's 1 s)
    assert load().handover_s == 1


def test_nothing_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("TRAINMASTER_URL", "TRAINMASTER_TOKEN", "TRAINMASTER_PROJECT", "TRAINMASTER_HANDOVER_S"):
        monkeypatch.delenv(name, raising=False)
    settings = load()
    assert settings.url == DEFAULT_URL and settings.token is None and settings.project is None
