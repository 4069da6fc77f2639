"""Write the published contracts: docs/openapi.json (REST) and docs/asyncapi.json (the bus), or check them.

    python -m docs.generate           # rewrite both files
    python -m docs.generate --check   # exit 1 if a checked-in file is out of date
"""
import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
SERVICES = ("submitter", "placement", "monitor", "estimator", "billing")
REGENERATE = "python -m docs.generate"


def openapi() -> dict[str, Any]:
    """The submitter's OpenAPI document (the portal's pages are left out of it)."""
    from services.submitter.app import SubmitterSettings, create_app

    return create_app(SubmitterSettings()).openapi()


def asyncapi() -> dict[str, Any]:
    """Every service's bus subscriptions, through FastStream's AsyncAPI 3.0 generation.

    Services answer the same subject under the same handler name (monitor and placement both have
    `on_job_event`), so each channel is titled `<service>:<subject>:<handler>` to keep them apart.
    """
    from faststream.nats import NatsBroker
    from faststream.specification import AsyncAPI

    broker = NatsBroker("nats://127.0.0.1:4222")
    for service in SERVICES:
        router = importlib.import_module(f"services.{service}.handlers").router
        before = len(broker.subscribers)
        broker.include_router(router)
        for subscriber in broker.subscribers[before:]:
            spec = subscriber.specification
            if not spec.config.title_:
                spec.config.title_ = f"{service}:{spec.channel_labels[0]}:{spec.call_name}"
    spec = AsyncAPI(broker, title="trainmaster bus", version="0.1.0",
                    description="JetStream subjects and request/reply subjects of trainmaster's services "
                                "(see README.md, Subjects).")
    return spec.to_specification().to_jsonable()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def documents() -> dict[Path, str]:
    return {DOCS / "openapi.json": render(openapi()), DOCS / "asyncapi.json": render(asyncapi())}


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
