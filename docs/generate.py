"""Write the published contracts: docs/openapi.json (REST), docs/asyncapi.json (the bus) and docs/states.md (the
job state machine, from shared/jobs.py's TRANSITIONS), or check them.

    python -m docs.generate           # rewrite both files
    python -m docs.generate --check   # exit 1 if a checked-in file is out of date
"""

import argparse
import importlib
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker, NatsRouter

from shared import busroles, events
from shared.bus import subjects_overlap
from shared.events import Message
from shared.jobs import TRANSITIONS, Phase

DOCS = Path(__file__).resolve().parent
SERVICES = ("submitter", "placement", "monitor", "estimator", "billing")
AGENT = "agent"
NODE = "{node_id}"  # the agent's subjects carry its node id
REGENERATE = "python -m docs.generate"


def openapi() -> dict[str, Any]:
    """The submitter's OpenAPI document (the portal's pages are left out of it)."""
    from services.submitter.app import SubmitterSettings, create_app

    return create_app(SubmitterSettings()).openapi()


def address(model: type[Message]) -> str:
    """A model's subject with its parameters named (`{node.node_id}` -> `{node_id}`)."""
    return re.sub(r"\{(?:[^}.]*\.)*([^}.]+)\}", r"{\1}", model.subject_template)


def wildcard(subject: str) -> str:
    """A subject with its `{parameters}` as `*`."""
    return re.sub(r"\{[^}]*\}", "*", subject)


def models() -> list[type[Message]]:
    """Every message of shared/events.py with a subject of its own, by name."""
    return [
        m
        for _, m in inspect.getmembers(events, inspect.isclass)
        if issubclass(m, Message) and m is not Message and "subject_template" in vars(m)
    ]


def permitted(role: str) -> tuple[str, ...]:
    """What a role may publish (busroles): a service's subjects, or an agent's (node n1 stands for any)."""
    return busroles.agent("n1").publish if role == AGENT else busroles.PUBLISHES[role]


def publications(role: str) -> list[type[Message]]:
    """The messages a role publishes: those whose subject its permissions allow (requests and the JetStream API
    are not messages of shared/events.py)."""
    return [m for m in models() if any(subjects_overlap(wildcard(m.subject_template), s) for s in permitted(role))]


def routers() -> dict[str, NatsRouter]:
    """Every process's subscriptions: the services' routers, and the agent's for any node."""
    found = {s: importlib.import_module(f"services.{s}.handlers").router for s in SERVICES}
    return found | {AGENT: importlib.import_module("services.agent.handlers").command_router(NODE)}


def declare_publishers(router: NatsRouter, role: str) -> None:
    """Publishers for the document only: events leave through each service's outbox (shared/store.py)."""
    for model in publications(role):
        doc = (model.__doc__ or "").split("\n\n")[0].strip()
        router.publisher(
            address(model),
            schema=model,
            title=f"{role}:{address(model)}:{model.__name__}",
            description=f"{role} publishes {model.__name__}. {doc}".strip(),
            include_in_schema=True,
        )
        legacy = model.legacy_subject
        if legacy and any(subjects_overlap(legacy, s) for s in permitted(role)):
            router.publisher(
                legacy,
                schema=model,
                title=f"{role}:{legacy}:{model.__name__}",
                description=f"{role} relays {model.__name__} here only where the version before wrote it to an "
                "outbox with this subject (for one version); readers still accept it here.",
                include_in_schema=True,
            )


def declare_listeners(router: NatsRouter, role: str) -> None:
    """Core NATS subjects a process reads with a callback of its own (the monitor's heartbeats), for the document."""
    for subject in busroles.LISTENS.get(role, ()):
        for model in [m for m in models() if subjects_overlap(wildcard(m.subject_template), subject)]:

            async def listen(event: Any) -> None:
                """Never called: the process reads this subject outside FastStream."""

            listen.__annotations__ = {"event": model, "return": None}
            router.subscriber(
                subject,
                title=f"{role}:{subject}:{model.__name__}",
                description=f"{role} reads {model.__name__} as it comes (core NATS, not stored).",
            )(listen)


def asyncapi() -> dict[str, Any]:
    """Every process's bus subscriptions and publications, through FastStream's AsyncAPI 3.0 generation.

    Services answer the same subject under the same handler name (monitor and placement both have
    `on_job_event`), so each channel is titled `<process>:<subject>:<handler>` (a publication:
    `<process>:<subject>:<message>`) to keep them apart.
    """
    from faststream.specification import AsyncAPI

    broker = NatsBroker("nats://127.0.0.1:4222")
    for role, router in routers().items():
        before = len(broker.subscribers)
        broker.include_router(router)
        for subscriber in broker.subscribers[before:]:
            spec = subscriber.specification
            if not spec.config.title_:
                spec.config.title_ = f"{role}:{spec.channel_labels[0]}:{spec.call_name}"
        declared = NatsRouter()
        declare_listeners(declared, role)
        declare_publishers(declared, role)
        broker.include_router(declared)
    spec = AsyncAPI(
        broker,
        title="trainmaster bus",
        version="0.1.0",
        description="What each of trainmaster's services and agents subscribes to and publishes: "
        "JetStream subjects, core NATS heartbeats, request/reply subjects "
        "(see docs/architecture.md, Subjects).",
    )
    return spec.to_specification().to_jsonable()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


STATES_INTRO = """# The job state machine

Generated from `shared/jobs.py:TRANSITIONS` (do not edit by hand; regenerate with `{regenerate}`).
Every phase change goes through `services/monitor/state.py:switch`, which refuses an edge not drawn here.
A secondary phase (`Pending[Queuing]`, `Pending[Scheduled]`, `Running[Hanging]`, `Failed[CreateFailed]`, ...)
says more about where a job is within its phase; a change of secondary phase alone is no edge of this diagram.
"""


def state_diagram() -> str:
    """The phases and their allowed changes as a Mermaid state diagram, in the order of `Phase`."""
    lines = ["stateDiagram-v2", f"    [*] --> {Phase.CREATING.value}"]
    for source in Phase:
        lines += [f"    {source.value} --> {target.value}" for target in Phase if target in TRANSITIONS[source]]
    lines += [f"    {phase.value} --> [*]" for phase in Phase if phase.is_finished()]
    return "\n".join(lines) + "\n"


def states() -> str:
    return STATES_INTRO.format(regenerate=REGENERATE) + "\n```mermaid\n" + state_diagram() + "```\n"


def documents() -> dict[Path, str]:
    return {
        DOCS / "openapi.json": render(openapi()),
        DOCS / "asyncapi.json": render(asyncapi()),
        DOCS / "states.md": states(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a checked-in file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in documents().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; regenerate with `{REGENERATE}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
