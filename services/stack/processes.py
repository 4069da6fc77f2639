"""Start and stop the whole stack as child processes: NATS, an embedded database per service, five services,
agents."""

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.busroles import MINTER
from shared.children import dies_with_parent
from shared.settings import database_name
from shared.store import embedded_socket, embedded_url
from services.agent.resources import agent_node_ids
from services.stack.forkserver import ForkedProcess, ForkServer, ForkServerError
from services.stack.identities import Identities, prepare_bus, route_secret, routes_config
from services.stack.migrate import split_single_database
from services.stack.settings import StackSettings

SERVICES = ("monitor", "placement", "estimator", "billing", "submitter")
RESTART_AFTER_S = 5.0  # a process that keeps exiting is started again at most this often
# the minter's own read-only cloud credentials, from the shell to it alone (the stack's settings carry no cloud key)
MINTER_CLOUD_SETTINGS = ("TRAINMASTER_EC2_", "TRAINMASTER_K8S_")
# Cloud credentials in the operator's shell: placement rents with them and agents reach object storage with them;
# the API, the monitor, the estimator and billing never talk to a cloud, and got them all the same.
CLOUD_ENV = ("AWS_", "AZURE_", "GOOGLE_", "GCLOUD_", "CLOUDSDK_", "KUBECONFIG")
NO_CLOUD = ("submitter", "monitor", "estimator", "billing")
HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": ""}  # CUDA (torch's included) then sees no device and holds no GPU memory


def executable(name: str) -> str:
    """A console script of this environment (the venv's bin first, then PATH)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def alive(pid: int) -> bool:
    """Whether a process still runs (a zombie of someone else's counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for_socket(path: Path, *, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as s:
            if s.connect_ex(str(path)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {path} after {timeout_s}s")


def outgoing_port_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections (Linux's default where it does not say)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports_at(*offsets: int) -> int:
    """A port p with p + offset free on loopback for every offset: where a stack of several NATS servers or API
    replicas fits (tests and benchmarks lay theirs out with it). Drawn below the kernel's range for outgoing
    connections where there is room: a port in that range, free when probed, can be taken by any connection
    made before the server binds it (a NATS server of a test then found its port in use)."""
    low, _ = outgoing_port_range()
    span = max(offsets, default=0)
    below = low - 1 - span > 10_000
    for _ in range(50):
        if below:
            base = random.randrange(10_000, low - span)
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                base = probe.getsockname()[1]
        try:
            for offset in offsets or (0,):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no free ports at offsets {offsets}")


def wait_for_port(port: int, *, timeout_s: float = 30, process: subprocess.Popen | ForkedProcess | None = None) -> None:
    """Until something listens on the port; a `process` meant to listen there that exits first fails at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.pid} exited ({process.returncode}) before listening on port {port}")
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s}s")


FORKS_STARTING = threading.Lock()  # one fork server a stack, whichever thread starts its first process
FORK_SERVER_DEATHS = 3  # a stack whose fork server died this often starts its processes as before


@dataclass
class Stack:
    settings: StackSettings
    processes: dict[str, subprocess.Popen | ForkedProcess] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. service tunables for a test
    forks: ForkServer | None = field(default=None, repr=False)  # the fork server, once a Python process is started
    forks_died: int = field(default=0, repr=False)  # fork servers of this stack that died

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir.resolve()

    def mongo_url_of(self, service: str) -> str:
        """The service's database server: the external one, else the service's own embedded server."""
        return self.settings.mongo_url or embedded_url(self.data_dir, service)

    def database_socket_of(self, service: str) -> Path:
        return embedded_socket(self.data_dir, service)

    @property
    def nats_servers(self) -> list[str]:
        """The process names of the NATS servers started here: "nats", then "nats-2", "nats-3" in a cluster."""
        return ["nats"] + [f"nats-{i}" for i in range(2, self.settings.nats_servers + 1)]

    @property
    def nats_url(self) -> str:
        """Every server's URL: a client reconnects to another when its server goes."""
        scheme = "tls" if self.settings.nats_tls_cert else "nats"
        return self.settings.nats_url or ",".join(
            f"{scheme}://127.0.0.1:{self.settings.nats_port + i}" for i in range(self.settings.nats_servers)
        )

    @property
    def stream_replicas(self) -> int:
        """Copies of each stream: as set, else one per server started here (1 with an external NATS)."""
        if self.settings.stream_replicas:
            return self.settings.stream_replicas
        return 1 if self.settings.nats_url else self.settings.nats_servers

    @property
    def identities(self) -> Identities:
        return Identities(self.data_dir / "bus", retire_moved_keys=not self.settings.nats_url)

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    def env(self) -> dict[str, str]:
        s = self.settings
        # the stack's own settings, not the shell's; a database URL only to the service it is for (`env_of`)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_") and k != "MONGO_URL"}
        env.update(
            {
                "TRAINMASTER_NATS_URL": self.nats_url,
                "TRAINMASTER_DATA_DIR": str(self.data_dir),
                "TRAINMASTER_API_HOST": s.api_host,
                "TRAINMASTER_API_PORT": str(s.api_port),
                "TRAINMASTER_HEARTBEAT_INTERVAL_S": str(s.heartbeat_interval_s),
                "TRAINMASTER_NODE_TIMEOUT_S": str(s.node_timeout_s),
                "TRAINMASTER_LOG_LEVEL": s.log_level,
                "TRAINMASTER_CHECKPOINT_SYNC_S": str(s.checkpoint_sync_s),
                "TRAINMASTER_CLUSTER_FILE": str(s.cluster_file.resolve()),
                "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]),
            }
        )
        if s.admin_token:
            env["TRAINMASTER_ADMIN_TOKEN"] = s.admin_token
        if s.checkpoint_url:
            env["TRAINMASTER_CHECKPOINT_URL"] = s.checkpoint_url
        if s.nats_ca_file:
            env["TRAINMASTER_NATS_CA_FILE"] = str(s.nats_ca_file.resolve())
        if len(self.node_ids()) != 1:  # its agents share this host's CPUs: the kernel places their tasks, not each
            env["TRAINMASTER_TASK_PIN_CPUS"] = "false"  # agent alone (each would pin its first task to one CPU)
        return {**env, **self.extra_env}

    def env_of(self, identity: str) -> dict[str, str]:
        """A process's environment with its own bus credentials (the minter also gets its keys; placement, that it
        may ask the minter for rented nodes' identities)."""
        env = {**self.env(), "TRAINMASTER_NATS_CREDS": str(self.identities.creds(identity))}
        if identity != "submitter":  # no process but the API holds the admin token
            env.pop("TRAINMASTER_ADMIN_TOKEN", None)
        elif self.settings.secrets_keys:  # nor the keys that seal jobs' secrets
            env["TRAINMASTER_SECRETS_KEYS"] = self.settings.secrets_keys
        if identity in NO_CLOUD:
            env = {k: v for k, v in env.items() if not k.startswith(CLOUD_ENV)}
        if identity == "placement":
            env["TRAINMASTER_NATS_MINTER"] = "true"
        if identity == MINTER:
            self.identities.minter()  # made, or moved from placement's folder, on first use
            env.update(HIDE_GPUS, TRAINMASTER_MINTER_FILE=str(self.identities.minter_file))
            env.update({k: v for k, v in os.environ.items() if k.startswith(MINTER_CLOUD_SETTINGS)})
        if identity in SERVICES:  # the GPUs are the tasks': no platform service (nor what it spawns) may use one
            env.update(HIDE_GPUS, MONGO_URL=self.mongo_url_of(identity))  # its own database; an agent none
        return env

    def make_data_dir(self) -> None:
        """Only the user running the stack can read what is in it."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)

    def _spawn(
        self, name: str, argv: list[str], *, env: dict[str, str] | None = None, umask: int = -1
    ) -> subprocess.Popen | ForkedProcess:
        self.make_data_dir()
        logs = self.data_dir / "logs"
        logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = env or self.env()
        cwd = Path(__file__).resolve().parents[2]
        # Gone with the stack: agents by SIGTERM (they stop their tasks); services, the bus and the database by
        # SIGKILL (services do not exit on SIGTERM once the bus is gone; a kill loses nothing: every change is
        # written with its events, and the bus and the database survive one).
        death = signal.SIGTERM if name.startswith("agent-") else signal.SIGKILL
        with (logs / f"{name}.log").open("ab") as out:
            forked = self._fork(name, argv, env=env, cwd=cwd, umask=umask, log=out.fileno(), death_signal=death)
            process = (
                forked
                if forked is not None
                else subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    cwd=cwd,
                    umask=umask,
                    preexec_fn=dies_with_parent(death),
                )
            )
        self.processes[name] = process
        return process

    def _fork(
        self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, umask: int, log: int, death_signal: int
    ) -> ForkedProcess | None:
        """`python -m module` forked by the stack's fork server (services/stack/forkserver.py), started at the first
        such process, and again if it died; None where it does not serve (another program, another interpreter
        environment, turned off by `fork_server`, a fork that failed): the caller starts it as a process of its
        own."""
        if not self.settings.fork_server or argv[:2] != [sys.executable, "-m"]:
            return None
        with FORKS_STARTING:
            if self.forks is not None and self.forks.process.poll() is not None:  # it died (its children with it)
                self.forks.stop()
                self.forks = None
                self.forks_died += 1
            if self.forks_died >= FORK_SERVER_DEATHS:  # it cannot stay up here: processes of their own from now
                return None
            if self.forks is None:
                self.forks = ForkServer(self.env(), cwd=cwd, log=self.data_dir / "logs" / "fork-server.log")
            forks = self.forks
        if not forks.serves(argv, env):
            return None
        try:
            return forks.spawn(argv, env=env, cwd=cwd, umask=umask, log=log, death_signal=death_signal, name=name)
        except ForkServerError as exc:
            print(f"trainmaster: {name} started as a process of its own: {exc}", file=sys.stderr, flush=True)
            return None

    def start_nats(self) -> None:
        if self.settings.nats_url:
            return
        self.make_data_dir()
        for name in self.nats_servers:
            self.start_nats_server(name)
        for i, name in enumerate(self.nats_servers):
            wait_for_port(self.settings.nats_port + i, process=self.processes[name])

    def start_nats_server(self, name: str) -> None:
        """One NATS server (again, after a kill: its store and accounts are where it left them). In a cluster each
        names itself and routes to the others on loopback."""
        s, i = self.settings, self.nats_servers.index(name)
        config, store = self.data_dir / f"{name}.conf", self.data_dir / name  # "nats": as a single server has it
        tls = (
            f'tls {{\n  cert_file: "{s.nats_tls_cert.resolve()}"\n  key_file: "{s.nats_tls_key.resolve()}"\n}}\n'
            if s.nats_tls_cert and s.nats_tls_key
            else ""
        )
        cluster = ""
        if s.nats_servers > 1:  # only a server that knows the stack's route secret routes in (`routes_config`)
            routes = [f"127.0.0.1:{s.nats_port + 10 + j}" for j in range(s.nats_servers)]
            secret = route_secret(self.identities.root)
            cluster = f'server_name: "{name}"\n' + routes_config(
                secret, routes, listen=f"127.0.0.1:{s.nats_port + 10 + i}"
            )
        config.write_text(
            f'listen: "127.0.0.1:{s.nats_port + i}"\nmax_payload: 8MB\nmax_control_line: 32KB\n{cluster}'
            f'jetstream {{\n  store_dir: "{store}"\n  sync_interval: always\n}}\n{tls}'
            + self.identities.server_config(resolver_dir=store / "accounts")
        )
        os.chmod(config, 0o600)
        self._spawn(name, [executable("nats-server"), "-c", str(config)], umask=0o077)

    def start_database(self, *services: str) -> None:
        """Each service's embedded database (every service's when none is named), on a Unix socket only the stack's
        user reaches (no TCP port a task could use); a data directory of the single database before them is split
        first (`services.stack.migrate`)."""
        if self.settings.mongo_url:
            return
        self.make_data_dir()
        db_dir = self.data_dir / "db"
        db_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(db_dir, 0o700)
        split_single_database(db_dir, {service: database_name(service) for service in SERVICES})
        for service in services or SERVICES:
            self.start_database_server(service)
        for service in services or SERVICES:
            wait_for_socket(self.database_socket_of(service))

    def start_database_server(self, service: str) -> None:
        """One service's embedded server: its own process, folder and socket (both folders 0700, the socket 0600).
        A socket folder under the shared temporary directory (a deep data directory's) must be this user's own
        real folder: one another user made there first (its name is predictable) would hold the socket the
        services send every command to."""
        folder = self.data_dir / "db" / service
        for path in {folder, self.database_socket_of(service).parent}:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            found = os.lstat(path)
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
                raise SystemExit(
                    f"{path} is not a folder of this user's own (another user made it first?): the database's "
                    "socket goes in no such place; remove it, or use a shorter TRAINMASTER_DATA_DIR"
                )
            os.chmod(path, 0o700)
        self._spawn(
            f"database-{service}",
            [
                sys.executable,
                "-m",
                "services.stack.database",
                str(self.database_socket_of(service)),
                "--data-dir",
                str(folder),
                "--log-file",
                str(self.data_dir / "logs" / f"database-{service}-server.log"),
                "--pid-file",
                str(self.data_dir / f"database-{service}.pid"),
            ],
            umask=0o077,
        )

    def start_service(self, name: str, *, replica: int = 1) -> None:
        """A service's process; its second replica is named "<service>-2" (and serves the API one port up)."""
        env = self.env_of(name)
        if self.settings.service_replicas > 1:
            env["TRAINMASTER_LEADER_LEASE"] = "true"
        if replica > 1:
            env["TRAINMASTER_API_PORT"] = str(self.settings.api_port + replica - 1)
        self._spawn(self.replica_name(name, replica), [sys.executable, "-m", f"services.{name}"], env=env)

    @staticmethod
    def replica_name(name: str, replica: int) -> str:
        return name if replica == 1 else f"{name}-{replica}"

    def service_processes(self) -> list[tuple[str, int]]:
        """(service, replica) of every service process the stack runs."""
        return [(name, r) for name in SERVICES for r in range(1, self.settings.service_replicas + 1)]

    def start_minter(self) -> None:
        """The one process holding the keys that sign users and the account (placement asks it for rented
        nodes' identities)."""
        self._spawn(MINTER, [sys.executable, "-m", "services.minter"], env=self.env_of(MINTER))

    def start_agent(self, node_id: str) -> None:
        self._spawn(
            f"agent-{node_id}",
            [sys.executable, "-m", "services.agent", "--node-id", node_id],
            env=self.env_of(f"agent-{node_id}"),
        )

    def admin_creds(self) -> Path:
        """Bus credentials that may do anything (the stack's own set-up; tests)."""
        return self.identities.creds("admin")

    def prepare_bus(self) -> None:
        """Declare the bus: the streams, every service's consumers and each static node's command consumer (no
        service or agent may make or change them)."""
        asyncio.run(
            prepare_bus(
                self.nats_url,
                creds=self.admin_creds(),
                node_ids=self.node_ids(),
                ca_file=self.settings.nats_ca_file,
                replicas=self.stream_replicas,
                log_max_bytes=self.settings.log_stream_max_bytes,
                prune=self.settings.bus_prune,
            )
        )

    def node_ids(self) -> list[str]:
        return agent_node_ids(self.settings.cluster_file)

    def start_all(self) -> None:
        self.identities.revoke_earlier()  # what an earlier start gave each process is good no more
        self.start_nats()
        self.start_database()
        self.prepare_bus()
        self.start_minter()
        for name, replica in self.service_processes():
            self.start_service(name, replica=replica)
        for node_id in self.node_ids():
            self.start_agent(node_id)
        self.wait_serving(timeout_s=60)

    def api_ports(self) -> list[int]:
        """The port of each API replica (the second one port up)."""
        return [self.settings.api_port + r for r in range(self.settings.service_replicas)]

    def wait_serving(self, *, timeout_s: float) -> None:
        """Wait for every API replica, with every process up: none exited, and each one started again here up for
        RESTART_AFTER_S since (alive at one look is no start that held). A process that exits meanwhile is started
        again, as the supervisor of `make run` does later: on a NATS cluster that is still electing its leaders a
        service's first bus request can time out, and one replica of the API failing its start must not fail the
        stack's (nor leave it with one replica, or a service without its standby). One that cannot be started
        again (a database) fails the wait at once."""
        deadline = time.monotonic() + timeout_s
        restarted: dict[str, float] = {}
        while True:
            left = deadline - time.monotonic()
            try:
                for port in self.api_ports():
                    wait_for_port(port, timeout_s=min(1.0, max(left, 0.05)))
                waiting = unsettled(self.dead(), restarted, now=time.monotonic())
                if not waiting:
                    return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
            else:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"processes of the stack exited and did not stay up: {waiting}")
                time.sleep(0.1)
            lost = [name for name, again in self.restart_dead(restarted) if not again]
            if lost:
                raise RuntimeError(f"processes of the stack exited and cannot be started again: {lost}")

    def restart_dead(self, restarted: dict[str, float]) -> list[tuple[str, bool]]:
        """Start again each process that exited, none more often than every RESTART_AFTER_S (`restarted`: when
        each was last started again, kept by the caller); (name, started again) for each one acted on. One this
        cannot restart is reported once, then left alone."""
        acted = []
        for name in self.dead():
            if time.monotonic() - restarted.get(name, -RESTART_AFTER_S) < RESTART_AFTER_S:
                continue
            again = self.restart(name)
            restarted[name] = time.monotonic() if again else float("inf")
            acted.append((name, again))
        return acted

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
        stop_group(self.processes.pop(name, None), timeout_s=timeout_s)

    def stop_all(self) -> None:
        """Each kind together, in this order: the agents (their tasks are reported), every service's replicas (all
        at once: a waiting replica cannot take over from one stopping), the on-demand agents, then the databases
        and the bus (one process after another, a stack's teardown took seconds more: an agent about one)."""

        def take(names: list[str]) -> list[subprocess.Popen | ForkedProcess | None]:
            return [self.processes.pop(name, None) for name in names]

        replicas = range(1, self.settings.service_replicas + 1)
        stop_groups(take([name for name in self.processes if name.startswith("agent-")]))
        stop_groups(take([self.replica_name(name, r) for name in SERVICES for r in replicas]))
        self.stop_provisioned()
        stop_groups(take(list(self.processes)))  # the databases and the bus servers
        if self.forks is not None:
            self.forks.stop()
            self.forks = None

    def stop_provisioned(self, *, timeout_s: float = 15) -> None:
        """Agents that placement started for on-demand nodes of the local-process provider: SIGTERM, and SIGKILL
        what is left after `timeout_s` (the bus goes down next, and an agent cannot report its end without it)."""
        groups = []
        for pid_file in (self.data_dir / "provisioned").glob("*.pid"):
            try:
                groups.append(int(pid_file.read_text()))
                os.killpg(groups[-1], signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            pid_file.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout_s
        while groups and time.monotonic() < deadline:
            groups = [g for g in groups if alive(g)]
            time.sleep(0.1)
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def restart(self, name: str) -> bool:
        """Start again a process of the stack that exited (a service, an agent, a NATS server, a service's embedded
        database), as it was started; False for a name it does not know. A database server comes back on its own
        files and socket: what it acknowledged is on disk (SQLite), and the services' clients reconnect to it."""
        for service, replica in self.service_processes():
            if self.replica_name(service, replica) == name:
                self.start_service(service, replica=replica)
                return True
        if name in self.nats_servers:
            self.start_nats_server(name)
            return True
        if name == MINTER:
            self.start_minter()
            return True
        if name.startswith("database-") and name.removeprefix("database-") in SERVICES and not self.settings.mongo_url:
            self.start_database_server(name.removeprefix("database-"))
            return True
        if name.startswith("agent-") and name.removeprefix("agent-") in self.node_ids():
            self.start_agent(name.removeprefix("agent-"))
            return True
        return False

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is not None]


def unsettled(dead: list[str], restarted: dict[str, float], *, now: float) -> list[str]:
    """The processes a stack coming up still waits for: each that is dead, and each started again (at the time
    `restarted` holds) less than RESTART_AFTER_S before `now`."""
    return sorted({*dead, *(name for name, at in restarted.items() if now - at < RESTART_AFTER_S)})


def stop_group(process: subprocess.Popen | ForkedProcess | None, *, timeout_s: float = 15) -> None:
    """SIGTERM a process's whole group, SIGKILL it after `timeout_s`; nothing if it is gone already."""
    stop_groups([process], timeout_s=timeout_s)


def stop_groups(processes: list[subprocess.Popen | ForkedProcess | None], *, timeout_s: float = 15) -> None:
    """`stop_group` for several at once (one deadline for all); what a stopped process left running in its group
    (a child it started) is killed with it."""
    running = [p for p in processes if p is not None and p.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
