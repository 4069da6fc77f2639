"""The submitter's shape, kept by machine (read from the source, as the import rules are): its collections are
reached only through its stores, and its use cases know nothing of the web, so a route, the ModelArts v1 dialect
and a search's trials call the same `Submitter` with plain values."""

import ast
from pathlib import Path

from tests.unit.test_import_rules import KNOWN, project_imports

PACKAGE = "services.submitter"
# The classes that own the submitter's collections: the only code that calls a collection's methods.
STORES = {
    "Repository",
    "ViewEntries",
    "LogStore",
    "NotificationStore",
    "Tokens",
    "AuditLog",
    "SearchStore",
    "SealedStore",
}
# Modules that may name the database or a collection by name: the stores' own and the wiring that hands each its
# collections.
NAMING = {f"{PACKAGE}.{m}" for m in ("repository", "logstore", "notificationstore", "app")}
COLLECTION_METHODS = {
    "find",
    "find_one",
    "insert_one",
    "update_one",
    "update_many",
    "delete_one",
    "delete_many",
    "count_documents",
    "replace_one",
    "bulk_write",
    "aggregate",
    "distinct",
    "find_one_and_update",
    "find_one_and_delete",
    "find_one_and_replace",
    "create_index",
    "command",
}
# The use cases and everything they stand on: no FastAPI, no Starlette, however deep.
CORE = {
    f"{PACKAGE}.{m}"
    for m in (
        "usecases",
        "refusals",
        "admission",
        "feasible",
        "catalogue",
        "rpc",
        "intake",
        "caps",
        "commands",
        "repository",
        "logstore",
        "notificationstore",
        "views",
    )
}
WEB = ("fastapi", "starlette")


def _names_the_database(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "db") or (isinstance(node, ast.Attribute) and node.attr == "db")


def collection_reaches(source: str) -> list[str]:
    """What a module does to a collection outside a store: `.db`, a collection by name (`db.api_*`), or one of a
    collection's methods called outside the methods of a store class."""
    tree = ast.parse(source)
    inside_stores = {
        id(node)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef) and cls.name in STORES
        for node in ast.walk(cls)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (node.attr == "db" or _names_the_database(node.value)):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in COLLECTION_METHODS
            and id(node) not in inside_stores
        ):
            found.append(f"line {node.lineno}: .{node.func.attr}()")
    return found


def submitter_modules() -> dict[str, Path]:
    return {m: p for m, p in KNOWN.items() if m == PACKAGE or m.startswith(PACKAGE + ".")}


def test_only_the_stores_reach_the_submitters_collections():
    wrong = {}
    for module, path in submitter_modules().items():
        reaches = collection_reaches(path.read_text())
        if module in NAMING:  # these may name the database and collections, not call them outside a store
            reaches = [r for r in reaches if r.endswith("()")]
        if reaches:
            wrong[module] = reaches
    assert wrong == {}


def test_the_use_cases_and_what_they_stand_on_know_nothing_of_the_web():
    seen, todo = set(), sorted(CORE)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [m for m in project_imports(KNOWN[module], KNOWN) if m.startswith(PACKAGE)]
    web = {m: sorted(n for n in _imported(KNOWN[m]) if n.partition(".")[0] in WEB) for m in sorted(seen)}
    assert {m: names for m, names in web.items() if names} == {}


def test_a_searchs_trials_are_submitted_without_a_request():
    trials = KNOWN[f"{PACKAGE}.searches.trials"]
    assert sorted(n for n in _imported(trials) if n.partition(".")[0] in WEB) == []


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


# -- the checks themselves catch what they are for ------------------------------------------------------------------
def test_a_collection_reached_around_the_stores_is_caught():
    source = (
        "class Repository:\n    async def get(self):\n        return await self.jobs.find_one({})\n"
        "async def route(request):\n    await request.app.state.repo.db.api_projects.update_one({}, {})\n"
        "    await repo.jobs.find_one({})\n"
    )
    assert sorted(collection_reaches(source)) == [
        "line 5: .api_projects",
        "line 5: .db",
        "line 5: .update_one()",
        "line 6: .find_one()",
    ]


def test_a_web_import_behind_a_use_case_is_caught(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from fastapi import Request\nimport starlette.requests\nfrom . import views\n")
    assert sorted(n for n in _imported(module) if n.partition(".")[0] in WEB) == ["fastapi", "starlette.requests"]
