"""The operator's declaration of the bus (`identities prepare`, compose's bus-prepare): which existing consumers
stay, where its stream settings come from, and what its container may touch."""

import sys
import time
from pathlib import Path

import pytest
import yaml
from nats.js.api import ConsumerConfig
from nats.js.errors import BadRequestError, ServerError

from shared import bus
from shared.bustopology import CONSUMERS, tidy, unwanted
from services.stack import identities

ROOT = Path(__file__).resolve().parents[2]
DECLARED = {(bus.stream_of(s["subject"]).name, s["durable"]) for role in CONSUMERS.values() for s in role}
DECLARED |= {("TM_NODE_CMD", "agent-n1")}


def consumer(name: str, **config) -> ConsumerConfig:
    return ConsumerConfig(name=name, durable_name=name, **config)


@pytest.mark.parametrize(
    "stream, config",
    [
        ("TM_NODE_CMD", consumer("agent-spy", deliver_subject="_INBOX_placement.x", filter_subject="tm.node.cmd.n1.>")),
        ("TM_JOBS", consumer("monitor-jobs", deliver_subject="tm.rpc.monitor.terminate")),  # a declared name, pushing
        ("TM_NODE_CMD", consumer("agent-n1", deliver_subject="_INBOX_agent-n1.x", filter_subject="tm.node.cmd.n1.>")),
        ("TM_JOBS", consumer("mirror", deliver_subject="$JS.S.x", filter_subject="tm.job.>")),  # an operator's mirror
        ("TM_NODE_CMD", consumer("agent-od-9", filter_subject="tm.node.cmd.>")),  # a node's name, every node's orders
        ("TM_NODE_CMD", consumer("agent-od-9", filter_subjects=["tm.node.cmd.od-9.>", "tm.node.cmd.n1.>"])),
    ],
)
def test_a_consumer_that_pushes_or_that_an_agent_may_read_as_the_platform_does_not_make_it_has_to_go(stream, config):
    assert unwanted(stream, config, declared=DECLARED) is not None


@pytest.mark.parametrize(
    "stream, config",
    [
        ("TM_JOBS", consumer("billing-ledger", filter_subject="tm.job.>")),  # a newer version's, after a rollback
        ("TM_JOBS", consumer("agent-od-9", filter_subject="tm.job.>")),  # an agent reads its name on TM_NODE_CMD only
        ("TM_NODE_CMD", consumer("debug", filter_subject="tm.node.cmd.n1.>")),
        ("TM_NODE_CMD", ConsumerConfig(filter_subject="tm.node.cmd.n1.>")),  # ephemeral
    ],
)
def test_a_pull_consumer_no_identity_may_read_stays_unless_pruned(stream, config):
    assert unwanted(stream, config, declared=DECLARED) is None
    assert unwanted(stream, config, declared=DECLARED, prune=True) is not None


@pytest.mark.parametrize(
    "stream, config",
    [
        ("TM_JOBS", bus.consumer_config(CONSUMERS["monitor"][0])),
        ("TM_NODE_CMD", bus.agent_consumer_config("n1")),
        ("TM_NODE_CMD", bus.agent_consumer_config("od-9")),  # a rented node's, made before they expired
        ("TM_NODE_CMD", bus.rented_consumer_config("od-9")),
    ],
)
def test_a_declared_consumer_and_a_rented_nodes_stay(stream, config):
    assert unwanted(stream, config, declared=DECLARED, prune=True) is None


def test_a_rented_nodes_consumer_expires_once_unread_and_a_static_nodes_never():
    assert bus.rented_consumer_config("od-9").inactive_threshold == bus.RENTED_CONSUMER_INACTIVE_S
    assert bus.agent_consumer_config("n1").inactive_threshold is None
    rented = bus.rented_consumer_config("od-9").evolve(inactive_threshold=None)
    assert rented == bus.agent_consumer_config("od-9")


class Consumers:
    """A JetStream manager whose consumer updates answer `refusal` (None: taken); each update and deletion noted."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal, self.calls = refusal, []

    async def add_consumer(self, stream: str, config: ConsumerConfig) -> None:
        self.calls.append(("update", config.name))
        if self.refusal is not None:
            raise self.refusal

    async def delete_consumer(self, stream: str, name: str) -> None:
        self.calls.append(("delete", name))


RENTED_BEFORE_EXPIRY = bus.agent_consumer_config("od-9")


async def tidied(consumers: Consumers, stream: str, config: ConsumerConfig, *, prune: bool = False) -> None:
    await tidy(consumers, stream, config, declared=DECLARED, prune=prune, deadline=time.monotonic() + 5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "description", ["deliver policy can not be updated", "can not update push consumer to pull based"]
)
async def test_a_rented_nodes_consumer_is_deleted_when_no_update_can_give_it_its_expiry(description):
    consumers = Consumers(ServerError(code=500, err_code=10012, description=description))
    await tidied(consumers, "TM_NODE_CMD", RENTED_BEFORE_EXPIRY)
    assert consumers.calls == [("update", "agent-od-9"), ("delete", "agent-od-9")]


@pytest.mark.parametrize(
    "refusal",
    [
        ServerError(code=500, err_code=10009, description="JetStream cluster can not handle request"),  # leaders
        ServerError(code=500, err_code=10012, description="consumer assignment timed out"),  # the create error, else
        BadRequestError(code=400, err_code=10013, description="consumer name already in use"),
    ],
)
async def test_any_other_refusal_of_a_rented_nodes_expiry_fails_the_declaration_and_deletes_nothing(refusal):
    """A 500 in a cluster's leader change deleted a live rented node's consumer for good: only placement makes one,
    at the rental, and the node's starts were never read."""
    consumers = Consumers(refusal)
    with pytest.raises(type(refusal)):
        await tidied(consumers, "TM_NODE_CMD", RENTED_BEFORE_EXPIRY)
    assert consumers.calls == [("update", "agent-od-9")]


async def test_a_newer_versions_consumer_is_kept_and_named_unless_pruned_and_a_push_consumer_always_goes(caplog):
    """A rollback's declaration deleted the consumers the newer version added (declared again, they re-read their
    whole stream) and every operator's mirror or debugging consumer."""
    newer, consumers = consumer("billing-ledger", filter_subject="tm.job.>"), Consumers()
    await tidied(consumers, "TM_JOBS", newer)
    assert consumers.calls == [] and "keeping consumer billing-ledger of TM_JOBS" in caplog.text
    await tidied(consumers, "TM_JOBS", newer, prune=True)
    await tidied(consumers, "TM_JOBS", consumer("mirror", deliver_subject="$JS.S.x", filter_subject="tm.job.>"))
    assert consumers.calls == [("delete", "billing-ledger"), ("delete", "mirror")]


def prepared(monkeypatch, tmp_path, *options: str) -> dict:
    """What `identities prepare` asks of `prepare_bus`."""
    asked = {}

    async def prepare_bus(url, **kwargs):
        asked.update(kwargs, url=url)

    (tmp_path / "cluster.toml").write_text('[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\n')
    monkeypatch.setattr(identities, "prepare_bus", prepare_bus)
    argv = ["identities", "prepare", "--creds", str(tmp_path / "admin.creds"), *options]
    monkeypatch.setattr("sys.argv", [*argv, "--cluster-file", str(tmp_path / "cluster.toml")])
    identities.main()
    return asked


def test_prepare_takes_the_stacks_stream_settings(monkeypatch, tmp_path):
    """The services used to read TRAINMASTER_STREAM_REPLICAS and TRAINMASTER_LOG_STREAM_MAX_BYTES; compose's
    bus-prepare passed neither, and its first declaration put an operator's larger output stream back to 4 GiB."""
    monkeypatch.setenv("TRAINMASTER_STREAM_REPLICAS", "3")
    monkeypatch.setenv("TRAINMASTER_LOG_STREAM_MAX_BYTES", str(16 * 1024**3))
    asked = prepared(monkeypatch, tmp_path)
    assert asked["replicas"] == 3 and asked["log_max_bytes"] == 16 * 1024**3 and asked["shrink"] is False
    assert asked["creds"] == tmp_path / "admin.creds" and asked["node_ids"] == ["n1"]


def test_prepare_prunes_only_when_asked(monkeypatch, tmp_path):
    assert prepared(monkeypatch, tmp_path)["prune"] is False
    assert prepared(monkeypatch, tmp_path, "--prune")["prune"] is True
    monkeypatch.setenv("TRAINMASTER_BUS_PRUNE", "true")
    assert prepared(monkeypatch, tmp_path)["prune"] is True


def test_compose_declares_the_bus_as_nobody_with_the_admins_creds_alone_and_the_stream_settings():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prepare = compose["bus-prepare"]
    assert prepare["user"] == "65534:65534"
    mounts = [m for m in prepare["volumes"] if isinstance(m, dict)]
    assert mounts == [
        {
            "type": "volume",
            "source": "bus",
            "target": "/run/trainmaster/bus",
            "read_only": True,
            "volume": {"subpath": "creds/admin"},
        }
    ]
    assert not any(isinstance(m, str) and m.startswith("bus:") for m in prepare["volumes"])
    command = prepare["command"]
    assert command[command.index("--creds") + 1] == "/run/trainmaster/bus/nats.creds" and "--dir" not in command
    assert {"TRAINMASTER_STREAM_REPLICAS", "TRAINMASTER_LOG_STREAM_MAX_BYTES"} <= set(prepare["environment"])
    assert prepare["environment"]["TRAINMASTER_BUS_PRUNE"] == "${TRAINMASTER_BUS_PRUNE:-false}"
    keys = compose["bus-keys"]["command"]
    assert keys[keys.index("--admin-uid") + 1] == "65534"  # the one file bus-prepare reads is nobody's


def test_write_gives_the_admins_creds_to_the_user_that_declares(monkeypatch, tmp_path):
    owners = []
    monkeypatch.setattr(identities.os, "chown", lambda path, uid, gid: owners.append((Path(path).name, uid, gid)))
    identities.write(identities.Identities(tmp_path / "bus"), node_ids=["n1"], resolver_dir=tmp_path, admin_uid=7)
    assert owners == [("admin", 7, 7), ("nats.creds", 7, 7)]
    assert (tmp_path / "bus" / "creds" / "agent-n1" / "nats.creds").exists()


def test_compose_servers_route_only_with_the_secret_bus_keys_writes(tmp_path):
    """deploy/nats.conf's cluster block is the one `bus-keys` writes (`--routes`): a route password made once and
    kept, 0600; the server takes the config as it is (`nats-server -t`). An open route port let anything on the
    compose network join the cluster and publish as the platform (found by review)."""
    import shutil
    import subprocess

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    keys = compose["bus-keys"]["command"]
    routes = keys[keys.index("--routes") + 1].split(",")
    assert routes == ["nats:6222", "nats-2:6222", "nats-3:6222"]
    bus_dir = tmp_path / "bus"
    identities.write(
        identities.Identities(bus_dir), node_ids=["n1"], resolver_dir=tmp_path, admin_uid=None, routes=routes
    )
    written = bus_dir / "server" / "routes.conf"
    text = written.read_text()
    secret = (bus_dir / "route.secret").read_text()
    assert oct(written.stat().st_mode & 0o777) == "0o600" and f'password: "{secret}"' in text
    assert text.count(f"nats-route://route:{secret}@") == 3
    identities.write(
        identities.Identities(bus_dir), node_ids=["n1"], resolver_dir=tmp_path, admin_uid=None, routes=routes
    )
    assert written.read_text() == text  # the same secret at every `up`
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy(ROOT / "deploy" / "nats.conf", etc / "nats.conf")
    (etc / "auth").symlink_to(bus_dir / "server")
    server = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    checked = subprocess.run(
        [server, "-c", str(etc / "nats.conf"), "-t"],
        env={"NATS_SERVER_NAME": "nats-1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout
    with pytest.raises(SystemExit, match="not host:port"):
        identities.write_routes(bus_dir, ["nats:6222\nlisten: 0.0.0.0"])
