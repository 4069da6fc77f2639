"""Agent wiring: one process per compute node."""
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from faststream import FastStream

from shared.bus import connect, durable, make_broker, publish
from shared.events import NodeCommand, StartTask, StopTask
from shared.service import Background, add_health, configure_logging
from shared.settings import CommonSettings
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore
from services.agent.preparation import Preparer
from services.agent.resources import describe_node, load_cluster, load_engines

log = logging.getLogger(__name__)


class AgentSettings(CommonSettings):
    node_id: str
    cluster_file: Path = Path("cluster.toml")
    use_nvml: bool = True
    shutdown_grace_s: float = 5
    checkpoint_url: str | None = None  # default: file://<data_dir>/checkpoints, shared by agents on one machine
    checkpoint_sync_s: float = 5


def create_app(settings: AgentSettings) -> FastStream:
    configure_logging(settings.log_level)
    cluster = load_cluster(settings.cluster_file)
    if settings.node_id not in cluster:
        raise SystemExit(f"node {settings.node_id!r} is not in {settings.cluster_file} (has: {', '.join(cluster)})")
    node = describe_node(cluster[settings.node_id], use_nvml=settings.use_nvml, virtual=True)
    broker = make_broker(settings.nats_url, name=f"agent-{node.node_id}")
    add_health(broker, f"agent.{node.node_id}")
    checkpoints = CheckpointStore(settings.checkpoint_url or f"file://{(settings.data_dir / 'checkpoints').resolve()}")
    preparer = Preparer(settings.data_dir / "agents" / node.node_id / "engines", load_engines(settings.cluster_file))
    agent = Agent(node=node, root=settings.data_dir / "agents" / node.node_id,
                  publish=lambda message: publish(broker, message), checkpoints=checkpoints, preparer=preparer,
                  checkpoint_sync_s=settings.checkpoint_sync_s, shutdown_grace_s=settings.shutdown_grace_s)
    background = Background()

    @broker.subscriber(**durable(f"tm.node.cmd.{node.node_id}.>", consumer=f"agent-{node.node_id}", batch=8))
    async def on_command(command: NodeCommand) -> None:
        """Start or stop a task on this node."""
        match command:
            case StartTask():
                await agent.start(command)
            case StopTask():
                await agent.stop(command)

    @asynccontextmanager
    async def lifespan():
        await connect(broker)
        yield

    async def started() -> None:
        await agent.register()
        await agent.report_unreported()
        background.every("heartbeat", settings.heartbeat_interval_s, agent.heartbeat)
        log.info("agent for node %s (%s, %d GPUs) up", node.node_id, node.kind, len(node.gpus))

    async def stopping() -> None:
        await agent.shutdown()
        await background.stop()

    app = FastStream(broker, lifespan=lifespan, after_startup=[started], on_shutdown=[stopping])
    app.agent = agent
    return app
