"""Agent subscriber: this node's commands, and what each does."""

from faststream.nats import NatsRouter

from shared.bus import agent_subscription
from shared.context import Context
from shared.events import NodeCommand, StartTask, StopTask
from shared.handlers import HandlerTable, dispatch
from services.agent.agent import Agent

# The monitor starts and stops the ranks of an attempt on this node.
COMMAND_HANDLERS: HandlerTable[Agent] = {
    StartTask: Agent.start,
    StopTask: Agent.stop,
}


def command_router(node_id: str) -> NatsRouter:
    """The node's command subscription (its consumer is created for it beforehand); the agent is taken from the
    broker's context under "agent". The AsyncAPI document declares it for node "{node_id}"."""
    router = NatsRouter()

    @router.subscriber(**agent_subscription(node_id))
    async def on_command(command: NodeCommand, agent: Agent = Context("agent")) -> None:
        """Start or stop a task on this node."""
        await dispatch(COMMAND_HANDLERS, command, agent)

    return router
