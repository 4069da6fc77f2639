"""Start and stop the whole stack as child processes: NATS, the embedded database, five services, agents."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.agent.resources import load_cluster

SERVICES = ("monitor", "placement", "estimator", "billing", "submitter")


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore")

    data_dir: Path = Path(".trainmaster")
    nats_port: int = 4222
    mongo_port: int = 27017
    api_port: int = 8080
    api_host: str = "127.0.0.1"
    mongo_url: str | None = Field(None, validation_alias="MONGO_URL", description="External MongoDB; else embedded.")
    nats_url: str | None = Field(None, description="External NATS (JetStream on); else one is started here.")
    cluster_file: Path = Path("cluster.toml")
    admin_token: str | None = None
    heartbeat_interval_s: float = 2.0
    node_timeout_s: float = 10.0
    checkpoint_sync_s: float = 5.0
    checkpoint_url: str | None = None
    log_level: str = "INFO"


def executable(name: str) -> str:
    """A console script of this environment (the venv's bin first, then PATH)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def wait_for_port(port: int, *, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s}s")


@dataclass
class Stack:
    settings: StackSettings
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. service tunables for a test

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir.resolve()

    @property
    def mongo_url(self) -> str:
        return self.settings.mongo_url or f"mongodb://127.0.0.1:{self.settings.mongo_port}"

    @property
    def nats_url(self) -> str:
        return self.settings.nats_url or f"nats://127.0.0.1:{self.settings.nats_port}"

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    def env(self) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_")}
        env.update({
            "TRAINMASTER_NATS_URL": self.nats_url, "MONGO_URL": self.mongo_url,
            "TRAINMASTER_DATA_DIR": str(self.data_dir), "TRAINMASTER_API_HOST": s.api_host,
            "TRAINMASTER_API_PORT": str(s.api_port), "TRAINMASTER_HEARTBEAT_INTERVAL_S": str(s.heartbeat_interval_s),
            "TRAINMASTER_NODE_TIMEOUT_S": str(s.node_timeout_s), "TRAINMASTER_LOG_LEVEL": s.log_level,
            "TRAINMASTER_CHECKPOINT_SYNC_S": str(s.checkpoint_sync_s),
            "TRAINMASTER_CLUSTER_FILE": str(s.cluster_file.resolve()),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]),
        })
        if s.admin_token:
            env["TRAINMASTER_ADMIN_TOKEN"] = s.admin_token
        if s.checkpoint_url:
            env["TRAINMASTER_CHECKPOINT_URL"] = s.checkpoint_url
        return {**env, **self.extra_env}

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.Popen:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = (logs / f"{name}.log").open("ab")
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env or self.env(),
                                   start_new_session=True, cwd=Path(__file__).resolve().parents[2])
        self.processes[name] = process
        return process

    def start_nats(self) -> None:
        if self.settings.nats_url:
            return
        config = self.data_dir / "nats.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            f'listen: "127.0.0.1:{self.settings.nats_port}"\nmax_payload: 8MB\n'
            f'jetstream {{\n  store_dir: "{self.data_dir / "nats"}"\n  sync_interval: always\n}}\n'
        )
        self._spawn("nats", [executable("nats-server"), "-c", str(config)])
        wait_for_port(self.settings.nats_port)

    def start_database(self) -> None:
        if self.settings.mongo_url:
            return
        (self.data_dir / "db").mkdir(parents=True, exist_ok=True)
        self._spawn("database", [executable("nx-27017"), "--data-dir", str(self.data_dir / "db"),
                                 "-p", str(self.settings.mongo_port),
                                 "--log-file", str(self.data_dir / "logs" / "database-server.log"),
                                 "--pid-file", str(self.data_dir / "database.pid")])
        wait_for_port(self.settings.mongo_port)

    def start_service(self, name: str) -> None:
        self._spawn(name, [sys.executable, "-m", f"services.{name}"])

    def start_agent(self, node_id: str) -> None:
        self._spawn(f"agent-{node_id}", [sys.executable, "-m", "services.agent", "--node-id", node_id])

    def node_ids(self) -> list[str]:
        return list(load_cluster(self.settings.cluster_file))

    def start_all(self) -> None:
        self.start_nats()
        self.start_database()
        for name in SERVICES:
            self.start_service(name)
        for node_id in self.node_ids():
            self.start_agent(node_id)
        wait_for_port(self.settings.api_port, timeout_s=60)

    def signal(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal one child's whole process group (tests use SIGKILL to crash it)."""
        process = self.processes[name]
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            process.wait()

    def stop(self, name: str, *, timeout_s: float = 15) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        """Agents first (their tasks are reported), then the services, then the database and the bus."""
        order = [n for n in self.processes if n.startswith("agent-")] + [s for s in reversed(SERVICES)]
        for name in order:
            self.stop(name)
        self.stop_provisioned()
        for name in ("database", "nats"):
            self.stop(name)

    def stop_provisioned(self) -> None:
        """Agents that placement started for on-demand nodes of the local-process provider."""
        for pid_file in (self.data_dir / "provisioned").glob("*.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            pid_file.unlink(missing_ok=True)

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is not None]
