"""The published contracts in docs/ match what the code generates, and list every process's publications."""

import difflib
import json

import pytest

from shared.bus import subjects_overlap
from shared.jobs import TRANSITIONS
from docs.generate import AGENT, DOCS, REGENERATE, SERVICES, documents, models, permitted, wildcard

DIFF_LINES = 40


@pytest.mark.parametrize("name", ["openapi.json", "asyncapi.json", "states.md"])
def test_checked_in_contract_is_current(name):
    path, text = next((p, t) for p, t in documents().items() if p.name == name)
    if not path.exists():
        pytest.fail(f"docs/{name} is missing; generate it with `{REGENERATE}`")
    current = path.read_text()
    if current != text:
        diff = list(
            difflib.unified_diff(current.splitlines(), text.splitlines(), f"docs/{name}", "generated", lineterm="", n=1)
        )
        pytest.fail(
            f"docs/{name} is out of date; regenerate it with `{REGENERATE}`\n"
            + "\n".join(diff[:DIFF_LINES])
            + ("\n..." if len(diff) > DIFF_LINES else ""),
            pytrace=False,
        )


def sent(document: dict, process: str) -> list[str]:
    """The addresses a process publishes on, as the AsyncAPI document says (its `send` operations)."""
    return [
        wildcard(document["channels"][key]["address"])
        for key, op in document["operations"].items()
        if op["action"] == "send" and key.startswith(f"{process}:")
    ]  # a publication's channel: its key


@pytest.mark.parametrize("process", [*SERVICES, AGENT])
def test_every_subject_a_process_may_publish_is_a_publication_of_the_document(process):
    document = json.loads((DOCS / "asyncapi.json").read_text())
    addresses = sent(document, process)
    events = [s for s in permitted(process) if not s.startswith(("tm.rpc.", "$JS."))]
    missing = [s for s in events if not any(subjects_overlap(s, a) for a in addresses)]
    assert events and not missing, (
        f"docs/asyncapi.json lacks {process}'s publications on {missing}: give each a "
        f"message in shared/events.py and regenerate with `{REGENERATE}`"
    )


def test_every_message_has_a_publisher_and_the_agent_its_command_subscription():
    document = json.loads((DOCS / "asyncapi.json").read_text())
    published = {
        op["channel"]["$ref"].rsplit(":", 1)[1] for op in document["operations"].values() if op["action"] == "send"
    }
    assert {m.__name__ for m in models()} <= published
    assert "agent:tm.node.cmd.{node_id}.>:OnCommand" in document["operations"]


def test_the_state_diagram_draws_exactly_the_allowed_phase_changes():
    diagram = (DOCS / "states.md").read_text().split("```mermaid\n", 1)[1].split("```", 1)[0]
    edges = {
        tuple(line.strip().split(" --> ")) for line in diagram.splitlines() if " --> " in line and "[*]" not in line
    }
    assert edges == {(source.value, target.value) for source, targets in TRANSITIONS.items() for target in targets}
