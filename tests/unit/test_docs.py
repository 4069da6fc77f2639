"""The published contracts in docs/ match what the code generates."""
import difflib

import pytest

from docs.generate import REGENERATE, documents

DIFF_LINES = 40


@pytest.mark.parametrize("name", ["openapi.json", "asyncapi.json"])
def test_checked_in_contract_is_current(name):
    path, text = next((p, t) for p, t in documents().items() if p.name == name)
    if not path.exists():
        pytest.fail(f"docs/{name} is missing; generate it with `{REGENERATE}`")
    current = path.read_text()
    if current != text:
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"docs/{name}", "generated",
                                         lineterm="", n=1))
        pytest.fail(f"docs/{name} is out of date; regenerate it with `{REGENERATE}`\n"
                    + "\n".join(diff[:DIFF_LINES]) + ("\n..." if len(diff) > DIFF_LINES else ""), pytrace=False)
