"""docker compose's database access: one user per service, a role covering exactly the collections its code uses,
authentication on, no published MongoDB port."""

import json
import re
from pathlib import Path

import yaml

from shared.settings import database_name

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("submitter", "placement", "monitor", "estimator", "billing")


def roles() -> dict[str, set[str]]:
    """The COLLECTIONS table of deploy/mongo-init.js."""
    script = (ROOT / "deploy" / "mongo-init.js").read_text()
    table = re.search(r"const COLLECTIONS = \{(.*?)\n\};", script, re.S).group(1)
    return {
        service: set(re.findall(r'"([a-z_]+)"', names))
        for service, names in re.findall(r"(\w+): \[(.*?)\]", table, re.S)
    }


def collections_used(service: str) -> set[str]:
    code = "\n".join(p.read_text() for p in (ROOT / "services" / service).rglob("*.py"))
    return set(re.findall(r"\bdb\.([a-z]+_[a-z_]+)\b", code))


def test_each_service_role_covers_exactly_the_collections_its_code_uses():
    table = roles()
    assert set(table) == set(SERVICES)
    for service in SERVICES:
        assert table[service] == collections_used(service), service
    owners = [c for names in table.values() for c in names]
    assert len(owners) == len(set(owners))  # no collection shared between two services


def test_the_init_script_makes_each_user_and_role_in_its_services_own_database():
    script = (ROOT / "deploy" / "mongo-init.js").read_text()
    assert "const database = `trainmaster_${service}`;" in script and database_name("x") == "trainmaster_x"
    assert "resource: { db: database, collection: name }" in script


def test_compose_runs_mongo_with_auth_unpublished_and_each_service_as_its_own_user():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    mongo = compose["mongo"]
    assert "--auth" in mongo["command"] and not mongo.get("ports")
    assert any("mongo-init.js:/docker-entrypoint-initdb.d/" in v for v in mongo["volumes"])
    for service in SERVICES:
        url = compose[service]["environment"]["MONGO_URL"]
        assert url.startswith(f"mongodb://{service}:${{TRAINMASTER_MONGO_{service.upper()}_PASSWORD}}@mongo:27017/")
        assert url.endswith(f"?authSource={database_name(service)}")  # one deployment, a database per service
    for name, spec in compose.items():
        if name.startswith("agent"):
            assert "MONGO_URL" not in (spec.get("environment") or {}), name


def test_compose_publishes_the_api_alone():
    """NATS, MongoDB and MinIO (every project's checkpoints) are reachable only inside compose's network."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {name for name, spec in compose.items() if spec.get("ports")} == {"submitter"}
    # plain HTTP with bearer tokens: on loopback unless the operator says otherwise (a TLS proxy in front)
    assert compose["submitter"]["ports"] == ["${TRAINMASTER_API_BIND:-127.0.0.1}:${TRAINMASTER_API_PORT:-8080}:8080"]
    bucket = "\n".join(compose["minio-bucket"]["entrypoint"])
    assert "MC_HOST_m=" in bucket and "alias set" not in bucket  # no root password on a command line
    assert "trainmaster-secret" not in (ROOT / "docker-compose.yml").read_text()  # no default password


def test_compose_runs_a_mongo_with_the_bulk_write_command_and_grants_nothing_cluster_wide_for_it():
    """MongoDB 8.0's `bulkWrite` answers each conditional replacement of a group in one command (on mongo:7 each is
    a command of its own). The server authorises it by each write's own namespace and action (no action of its
    own exists), so the users' collection roles are all it needs: the script grants nothing on the cluster."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert compose["mongo"]["image"].startswith("mongo:8")
    script = (ROOT / "deploy" / "mongo-init.js").read_text()
    assert "cluster" not in script and '"admin"' not in script


def test_no_two_containers_share_a_data_folder():
    """Every service and agent had one data volume: a static node's agent (root in its container, a stranger to the
    platform) read the generated admin token and placement's rented nodes' bus credentials there (found by review)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    owners: dict[str, list[str]] = {}
    for name, spec in compose["services"].items():
        for volume in spec.get("volumes") or []:
            source = volume.get("source") if isinstance(volume, dict) else volume.split(":")[0]
            if source in compose["volumes"] and source != "bus":  # the bus volume: each mounts its own subpath
                owners.setdefault(source, []).append(name)
    shared = {volume: names for volume, names in owners.items() if len(names) > 1}
    assert shared == {}, shared
    agents = [n for n in compose["services"] if n.startswith("agent")]
    assert all(any(v == f"{n}-data" for v in owners) for n in agents)


def test_compose_gives_keys_to_the_bucket_to_the_agents_alone_a_user_of_their_own_allowed_its_objects_only():
    """Only the agents read and write the bucket: until 2026-11-29 every service held MinIO's root keys as AWS_*
    (placement's boto3 sent them to EC2 in place of its own), and the agents could administer MinIO."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, spec in compose.items():
        env = spec.get("environment") or {}
        if name.startswith("agent"):
            assert env["AWS_ACCESS_KEY_ID"] == "trainmaster-agent" and "MINIO_ROOT" not in str(env), name
            assert env["AWS_SECRET_ACCESS_KEY"].startswith("${TRAINMASTER_MINIO_AGENTS_PASSWORD")
        elif name == "placement":  # its own EC2 keys, from the operator's shell
            assert env["AWS_ACCESS_KEY_ID"] == "${TRAINMASTER_PLACEMENT_AWS_ACCESS_KEY_ID:-}", env
        elif name not in ("minio", "minio-bucket"):
            assert not {k for k in env if k.startswith("AWS_") or k.startswith("FSSPEC_")}, name
            assert "MINIO" not in str(env), name
    script = compose["minio-bucket"]["entrypoint"][-1]
    policy = script.split("<<'POLICY'\n")[1].split("\nPOLICY")[0]
    statements = json.loads(policy)["Statement"]
    assert {r for s in statements for r in s["Resource"]} == {"arn:aws:s3:::trainmaster", "arn:aws:s3:::trainmaster/*"}
    assert all(a.startswith("s3:") for s in statements for a in s["Action"])  # nothing of MinIO's own (admin:*)
    assert "mc admin user add m trainmaster-agent" in script and "--user trainmaster-agent" in script
    secrets = (ROOT / "deploy" / "mongo-secrets.sh").read_text()
    assert "TRAINMASTER_MINIO_AGENTS_PASSWORD=" in secrets


def test_the_image_installs_aws_and_s3_at_the_pins_the_tests_use():
    """s3fs's aiobotocore pins botocore: [aws] and [s3] install together only at these pins, which the tests use;
    the compose image needs both (its agents copy to MinIO, its minter and placement rent from EC2)."""
    assert "'.[s3,aws,gpu]'" in (ROOT / "Dockerfile").read_text()
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("aws", "s3"):
        for pin in project[extra]:
            assert pin in project["test"], (extra, pin)
