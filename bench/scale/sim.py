"""Simulated agents: N nodes in one process, speaking with the agent's own code (`services.agent.agent.Agent`'s
register, heartbeat, started and exited messages, published by `shared.bus.publish`), over one connection.

Each simulated node borrows the agent's methods, so what reaches the bus is byte for byte what an agent sends;
only the task is simulated: a start command is answered with `started`, one output line shipped by the agent's
`LogShipper`, then `exited` (code 0) after `task_s`.
"""

import asyncio
import bisect
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from faststream.nats import NatsBroker
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import TypeAdapter

from shared import busroles
from shared.bus import NODE_CADENCE, NODE_COMMANDS, connect, make_broker, publish
from shared.buscreds import Permissions
from shared.events import LogLine, NodeCommand, StartTask
from shared.nodes import Gpu, NodeInfo
from services.agent.agent import Agent
from services.agent.hangs import HangPolicy
from services.agent.pace import Pace
from services.agent.shipping import LogShipper
from services.agent.supervision import exited_event, started_event

log = logging.getLogger(__name__)

IDENTITY = "bench-agents"
COMMANDS = "tm.node.cmd.*.>"
COMMAND = TypeAdapter(NodeCommand)


def permissions() -> Permissions:
    """The bench's own identity, minted by the bench only: it speaks for every node (as each node's agent may for
    its own) and reads every node's commands through one consumer of its own."""
    return Permissions(
        publish=(
            "tm.node.evt.*.registered",
            "tm.node.evt.*.heartbeat",
            "tm.job.task.*.>",
            "tm.log.*.*",
            *busroles.reads(IDENTITY, COMMANDS),
        ),
        subscribe=(NODE_CADENCE,),
        inbox=busroles.inbox(IDENTITY),
    )


@dataclass
class SimTask:
    start: StartTask
    pid: int = 0
    started_at: float = field(default_factory=time.time)
    stop_reason: str | None = None  # never stopped here (the agent's heartbeat leaves fenced tasks out)


class SimAgent:
    """One node: the agent's message code on simulated tasks."""

    register = Agent.register
    heartbeat = Agent.heartbeat
    publish_reliably = Agent.publish_reliably

    def __init__(self, node: NodeInfo, broker: NatsBroker) -> None:
        self.node = node
        self.boot_id = uuid.uuid4().hex
        self.heartbeats = 0
        self.sent: list[float] = []  # when each heartbeat went out (the bench's clock)
        self.tasks: dict[str, SimTask] = {}
        self.broker = broker
        self.hangs = HangPolicy()  # no NVML: simulated GPUs send no readings
        self.fence = None  # simulated nodes never fence: a heartbeat is not waited for
        self.acknowledge = None
        self.connected = lambda: True  # heartbeats go out whatever the connection (the bench waits out no outage)

    async def publish(self, message) -> None:
        await publish(self.broker, message)


def sim_node(i: int, *, gpus: int) -> NodeInfo:
    return NodeInfo(
        node_id=f"sim-{i:05d}",
        kind="local",
        cpu_count=64,
        memory_gb=512,
        price_per_hour=1.0,
        labels={"pool": "default"},
        gpus=tuple(Gpu(index=g, model="SIM-GPU", memory_gb=80, tflops=300) for g in range(gpus)),
    )


def cluster_records(nodes: int, *, gpus: int = 8) -> str:
    """The simulated nodes as cluster-file records (`agent = false`: the stack starts no agent for them), so that
    the services take their registrations as they do a real static node's."""
    return "".join(
        f'[[nodes]]\nid = "sim-{i:05d}"\nagent = false\nkind = "local"\ncpu_count = 64\n'
        f"memory_gb = 512\nprice_per_hour = 1.0\n"
        f'gpus = [{{ model = "SIM-GPU", memory_gb = 80, tflops = 300, count = {gpus} }}]\n\n'
        for i in range(nodes)
    )


@dataclass
class SimFleet:
    nats_url: str
    creds: Path
    nodes: int
    interval_s: float = 2.0
    gpus: int = 8
    task_s: float = 0.2
    output_dir: Path = Path("/tmp")
    agents: dict[str, SimAgent] = field(default_factory=dict)
    send_lag_max_s: float = 0.0  # how late the bench itself sent a heartbeat (it must not be the bottleneck)
    started: int = 0
    exited: int = 0

    async def open(self) -> None:
        self.broker = make_broker(self.nats_url, name=IDENTITY, creds=self.creds)
        await connect(self.broker, declare=False)
        self.agents = {
            n.node_id: SimAgent(n, self.broker) for n in (sim_node(i, gpus=self.gpus) for i in range(self.nodes))
        }
        # as every agent does: heartbeat at the interval the monitor announces for the fleet's size
        self.pace = Pace(self.interval_s)

        async def heard(msg) -> None:
            self.pace.heard(msg.data)

        await self.broker.config.connection_state.connection.subscribe(NODE_CADENCE, cb=heard)

    async def register_all(self, *, parallel: int = 200) -> None:
        gate = asyncio.Semaphore(parallel)

        async def one(agent: SimAgent) -> None:
            async with gate:
                await agent.register()

        await asyncio.gather(*(one(a) for a in self.agents.values()))

    async def heartbeat_forever(self) -> None:
        """Every node beats every interval (`interval_s`, or what the monitor announces), spread evenly over it (as
        independent agents would)."""
        agents = list(self.agents.values())
        random.shuffle(agents)
        round_start = time.monotonic()
        while True:
            interval = self.pace.interval_s
            step = interval / max(len(agents), 1)
            for i, agent in enumerate(agents):
                due = round_start + i * step
                wait = due - time.monotonic()
                if wait < 0:
                    self.send_lag_max_s = max(self.send_lag_max_s, -wait)
                await asyncio.sleep(max(wait, 0))  # always yield: a core publish never does, and behind schedule
                await agent.heartbeat()  # this loop would starve the connection's own flusher
                agent.sent.append(time.monotonic())
            round_start += interval

    def spoke_within(self, node_id: str, *, start: float, end: float) -> bool:
        """Whether the bench sent a heartbeat of this node between two moments of its clock."""
        sent = self.agents[node_id].sent
        i = bisect.bisect_left(sent, start)
        return i < len(sent) and sent[i] <= end

    async def answer_commands(self) -> None:
        """Start commands of every simulated node through the bench's own consumer: started, then exited."""
        js = self.broker.config.connection_state.stream
        config = ConsumerConfig(
            name=IDENTITY,
            durable_name=IDENTITY,
            filter_subject=COMMANDS,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW,
            max_ack_pending=10_000,
            ack_wait=30,
        )
        await js.add_consumer(NODE_COMMANDS.name, config=config)
        sub = await js.pull_subscribe_bind(
            durable=IDENTITY, stream=NODE_COMMANDS.name, inbox_prefix=f"{busroles.inbox(IDENTITY)}.".encode()
        )
        running: set[asyncio.Task] = set()
        while True:
            try:
                msgs = await sub.fetch(batch=256, timeout=0.5)
            except TimeoutError:
                continue
            for msg in msgs:
                command = COMMAND.validate_json(msg.data)
                agent = self.agents.get(command.node_id)
                if isinstance(command, StartTask) and agent is not None:
                    task = asyncio.create_task(self._run(agent, command))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await msg.ack()

    async def _run(self, agent: SimAgent, command: StartTask) -> None:
        key = f"{command.job_id}:{command.attempt}:{command.rank}"
        task = SimTask(start=command)
        agent.tasks[key] = task
        shipper = LogShipper(
            job_id=command.job_id,
            attempt=command.attempt,
            rank=command.rank,
            node_id=agent.node.node_id,
            path=self.output_dir / f"{key.replace(':', '-')}.log",
            publish=agent.publish_reliably,
        )
        await agent.publish_reliably(started_event(agent.node, agent.boot_id, task))
        self.started += 1
        shipper.add(LogLine(t=time.time(), s="out", line="simulated task"))
        await asyncio.sleep(self.task_s)
        agent.tasks.pop(key, None)
        await shipper.close()
        exited = exited_event(agent.node, command, reason="completed", message="", status=0)
        await agent.publish_reliably(exited)
        self.exited += 1

    async def close(self) -> None:
        """Close the connection without draining (a drain waits on subscriptions the cancelled loops left)."""
        await self.broker.config.connection_state.connection.close()
