"""The import rules, kept by machine: a service imports only `shared` and its own package, `shared` no service,
the placement policy no I/O (it drives the service, the simulator and the benchmarks alike), and no module imports
itself back through others. Read from the source (AST), so lazy and TYPE_CHECKING imports count too."""

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("shared", "services", "tests", "bench", "docs")
# The stack launcher starts every process and checks, before it starts them, the two inputs it reads on their
# behalf: the cluster file (one agent per node entry) and the admin token (the submitter's rule for its length).
LAUNCHER_READS = {"services.agent.resources", "services.submitter.auth"}
# Modules through which code reaches a disk, a network, a database, a process or the bus.
IO_MODULES = {
    "asyncio",
    "aiohttp",
    "boto3",
    "botocore",
    "faststream",
    "fsspec",
    "glob",
    "http",
    "httpx",
    "importlib",
    "io",
    "kubernetes",
    "multiprocessing",
    "nats",
    "os",
    "pathlib",
    "pickle",
    "psutil",
    "pymongo",
    "requests",
    "s3fs",
    "shelve",
    "shutil",
    "socket",
    "sqlite3",
    "ssl",
    "subprocess",
    "tempfile",
    "urllib",
}
IO_BUILTINS = {"open", "print", "input", "exec", "eval", "__import__", "breakpoint"}
IO_METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "open",
    "unlink",
    "mkdir",
    "touch",
    "iterdir",
    "rglob",
    "glob",
}
POLICY = "services.placement.policy"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(*packages: str) -> dict[str, Path]:
    return {module_name(p): p for package in packages for p in sorted((ROOT / package).rglob("*.py"))}


def imported(source: str, *, module: str, is_package: bool = False) -> Iterator[str]:
    """Every name an import statement anywhere in `source` imports, relative ones made absolute (`from a import b`:
    `a.b`, a module or a name in module `a`)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            yield from (base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names)


def io_uses(source: str) -> list[str]:
    """The I/O a module's source does by itself: I/O modules imported, I/O builtins and file methods called."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {n}" for n in names if n.partition(".")[0] in IO_MODULES]
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in IO_BUILTINS:
                found.append(f"{node.func.id}()")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in IO_METHODS:
                found.append(f".{node.func.attr}()")
    return found


def owner(name: str, known: dict[str, Path]) -> str | None:
    """The module an imported name is or lives in (`a.b.f` -> `a.b`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def project_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules a file imports."""
    module = module_name(path)
    names = imported(path.read_text(), module=module, is_package=path.name == "__init__.py")
    return {owner(n, known) for n in names if owner(n, known)} - {module}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def outsiders(module: str, names: set[str]) -> list[str]:
    """What a service module imports that the rule forbids."""
    own = ".".join(module.split(".")[:2])
    allowed = ("shared", own) + (tuple(LAUNCHER_READS) if own == "services.stack" else ())
    return sorted(n for n in names if not any(n == a or n.startswith(a + ".") for a in allowed))


KNOWN = modules("shared", "services")


def named(module: str) -> set[str]:
    """The project modules (or names in them) that a module's imports name."""
    path = KNOWN[module]
    names = imported(path.read_text(), module=module, is_package=path.name == "__init__.py")
    return {n for n in names if n.partition(".")[0] in PROJECT}


def test_a_service_imports_only_shared_and_its_own_package():
    wrong = {m: outsiders(m, named(m)) for m in KNOWN if m.startswith("services.")}
    assert {m: names for m, names in wrong.items() if names} == {}


def test_shared_imports_no_service_nor_tests():
    wrong = {m: sorted(n for n in named(m) if n.partition(".")[0] != "shared") for m in KNOWN if m.startswith("shared")}
    assert {m: names for m, names in wrong.items() if names} == {}


def test_the_cli_is_a_client_of_the_rest_api_only():
    """It runs on a researcher's machine and speaks HTTP: no bus, database or service code comes with it."""
    cli = {m: p for m, p in KNOWN.items() if m.startswith("services.cli")}
    assert {
        m: sorted(n for n in project_imports(p, KNOWN) if not n.startswith("services.cli")) for m, p in cli.items()
    } == {m: [] for m in cli}


def test_the_placement_policy_and_what_it_imports_do_no_io():
    seen, todo = set(), [m for m in KNOWN if m.startswith(POLICY)]
    while todo:  # the policy's own modules and every project module they reach
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += project_imports(KNOWN[module], KNOWN)
    assert {m: io_uses(KNOWN[m].read_text()) for m in sorted(seen)} == {m: [] for m in sorted(seen)}


def test_no_module_imports_itself_back_through_others():
    graph = {m: project_imports(p, KNOWN) for m, p in KNOWN.items()}
    assert circles(graph) == []


# -- the checks themselves catch what they are for ------------------------------------------------------------------
def test_a_relative_import_of_another_service_is_caught():
    names = set(imported("from ..submitter import auth\nfrom . import jobs", module="services.billing.service"))
    assert names == {"services.submitter.auth", "services.billing.jobs"}
    assert outsiders("services.billing.service", names) == ["services.submitter.auth"]
    assert outsiders("services.stack.processes", {"services.agent.resources", "services.agent.runner"}) == [
        "services.agent.runner"
    ]


def test_io_is_caught_in_imports_builtins_and_file_methods():
    source = (
        "import pymongo\nfrom asyncio import create_subprocess_exec\nimport os.path\n"
        "def f(p):\n    if TYPE_CHECKING:\n        import nats\n    open(p)\n    return p.read_text()\n"
    )
    assert sorted(io_uses(source)) == [
        ".read_text()",
        "import asyncio",
        "import nats",
        "import os.path",
        "import pymongo",
        "open()",
    ]
    assert io_uses("import math\nfrom dataclasses import dataclass\nx = math.log(2)\n") == []


def test_a_circle_through_a_lazy_or_type_only_import_is_caught():
    known = dict.fromkeys(["p", "p.a", "p.b", "p.c", "p.d"], ROOT)
    sources = {
        "p.a": "if TYPE_CHECKING:\n    from p.b import B",
        "p.b": "def f():\n    from p import c",
        "p.c": "import p.a",
        "p.d": "from p.a import f",
        "p": "",
    }
    graph = {m: {owner(n, known) for n in imported(text, module=m)} - {None} for m, text in sources.items()}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]
