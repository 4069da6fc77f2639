"""FastStream's `Context` and `NatsMessage` for subscribers' parameters, resolved on the event loop.

FastStream's own `Context` resolves by a plain function, which its dependency solver (fast_depends) runs on a worker
thread: every `Context(...)` parameter of every delivered message was a hand-off to a thread and back (a queue, a
lock, a wake-up of the loop), and on two cores that hand-off cost more than the lookup by far. This one is the same
lookup as a coroutine, which the solver awaits in place. Subscribers import `Context` and `NatsMessage` from here.
"""

from typing import Annotated, Any

from faststream._internal.context import Context as _Context  # what `faststream.Context(...)` returns
from faststream.nats.message import NatsMessage as _NatsMessage


class LoopContext(_Context):
    """`faststream.Context(name)`, looked up without leaving the event loop."""

    async def use(self, /, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().use(**kwargs)


def Context(name: str) -> Any:  # noqa: N802 - a parameter's default, like `faststream.Context`
    """A subscriber parameter filled from the broker's context (`context.set_global(name, ...)`)."""
    return LoopContext(name)


NatsMessage = Annotated[_NatsMessage, LoopContext("message")]
