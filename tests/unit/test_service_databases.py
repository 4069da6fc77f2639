"""Each service's database: its own URL (falling back to the common MONGO_URL) and its own database name; under
`make run` its own embedded server, which no other process is told of."""

import pytest

from services.billing.app import BillingSettings
from services.estimator.app import EstimatorSettings
from services.monitor.app import MonitorSettings
from services.placement.app import PlacementSettings
from services.stack.processes import SERVICES, Stack, StackSettings
from services.submitter.app import SubmitterSettings

KINDS = {
    "submitter": SubmitterSettings,
    "placement": PlacementSettings,
    "monitor": MonitorSettings,
    "estimator": EstimatorSettings,
    "billing": BillingSettings,
}


@pytest.fixture(autouse=True)
def no_database_variables(monkeypatch):
    for service in SERVICES:
        monkeypatch.delenv(f"TRAINMASTER_{service.upper()}_MONGO_URL", raising=False)
        monkeypatch.delenv(f"TRAINMASTER_{service.upper()}_MONGO_DB", raising=False)
    monkeypatch.delenv("TRAINMASTER_MONGO_DB", raising=False)


def test_one_deployment_serves_every_service_each_in_a_database_of_its_own(monkeypatch):
    monkeypatch.setenv("MONGO_URL", "mongodb://mongo:27017")
    settings = {service: kind() for service, kind in KINDS.items()}
    assert {s.mongo_url for s in settings.values()} == {"mongodb://mongo:27017"}
    assert len({s.mongo_db for s in settings.values()}) == len(SERVICES)
    assert settings["billing"].mongo_db == "trainmaster_billing"


def test_a_service_of_its_own_url_uses_it_the_others_the_common_one(monkeypatch):
    monkeypatch.setenv("MONGO_URL", "mongodb://common:27017")
    monkeypatch.setenv("TRAINMASTER_BILLING_MONGO_URL", "mongodb://ledger-db:27017")
    assert BillingSettings().mongo_url == "mongodb://ledger-db:27017"
    assert MonitorSettings().mongo_url == "mongodb://common:27017"
    assert BillingSettings(mongo_url="mongodb://given", mongo_db="given").mongo_db == "given"


def test_under_make_run_each_service_is_told_only_of_its_own_server_and_agents_of_none(tmp_path, monkeypatch):
    monkeypatch.setenv("MONGO_URL", "mongodb://from-the-shell")  # not the stack's: an agent must not inherit it
    (tmp_path / "cluster.toml").write_text("")
    stack = Stack(StackSettings(data_dir=tmp_path, cluster_file=tmp_path / "cluster.toml", mongo_url=None))
    urls = {service: stack.env_of(service)["MONGO_URL"] for service in SERVICES}
    assert len(set(urls.values())) == len(SERVICES)
    assert all(f"%2Fdb%2F{service}%2F" in url for service, url in urls.items())
    assert "MONGO_URL" not in stack.env_of("agent-n1")
    assert "MONGO_URL" not in stack.env()  # the bus and the database servers get none either


def test_with_an_external_database_every_service_gets_it(tmp_path):
    (tmp_path / "cluster.toml").write_text("")
    stack = Stack(
        StackSettings(data_dir=tmp_path, cluster_file=tmp_path / "cluster.toml", mongo_url="mongodb://mongo:27017")
    )
    assert {stack.env_of(service)["MONGO_URL"] for service in SERVICES} == {"mongodb://mongo:27017"}
    stack.start_database()  # starts nothing
    assert stack.processes == {}
