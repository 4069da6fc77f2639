"""A process does not load aiohttp at its start (nats-py imports it for the WebSocket transport alone), nor httpx's
command line (httpx imports it, with rich and pygments, wherever they are installed), and a stand-in is the real
module from its first use on."""

import subprocess
import sys
import types
from pathlib import Path

from shared import deferred

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = ("agent", "monitor", "placement", "estimator", "billing", "submitter", "minter")


def fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_no_process_loads_aiohttp_at_its_start():
    imports = "; ".join(f"import services.{name}.__main__" for name in ENTRIES)
    loaded = fresh(f"import sys; {imports}; print(sorted(m for m in sys.modules if m.startswith('aiohttp.')))")
    assert loaded == "[]"


def test_the_stand_in_loads_aiohttp_at_its_first_use_and_is_then_the_real_module():
    code = """
import sys
import services.agent.__main__
import nats.aio.transport as transport
assert transport.aiohttp.WSMsgType.BINARY.name == "BINARY"  # what nats-py reads of it on a ws:// connection
import aiohttp
from aiohttp import web
assert type(sys.modules["aiohttp"]) is type(sys), type(sys.modules["aiohttp"])
assert aiohttp.ClientSession is sys.modules["aiohttp.client"].ClientSession and web.Application
print("ok")
"""
    assert fresh(code) == "ok"


def test_a_module_loaded_already_or_not_installed_is_left_alone(monkeypatch):
    loaded = types.ModuleType("tm_loaded_already")
    monkeypatch.setitem(sys.modules, "tm_loaded_already", loaded)
    deferred.defer("tm_loaded_already", "tm_not_installed_anywhere")
    assert sys.modules["tm_loaded_already"] is loaded and "tm_not_installed_anywhere" not in sys.modules


def test_no_process_loads_httpxs_command_line_at_its_start():
    imports = "; ".join(f"import services.{name}.__main__" for name in (*ENTRIES, "cli"))
    loaded = "sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'pygments'})"
    code = f"import sys; {imports}; import httpx; print({loaded})"
    assert fresh(code) == "[]"


def test_httpxs_command_line_loads_when_it_is_called_and_httpx_works_meanwhile():
    code = """
import sys
import services.cli.__main__
import httpx
answer = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, text="ok"))).get("http://x/")
assert answer.text == "ok" and "rich" not in sys.modules
try:
    httpx.main(["--help"])  # what httpx's own console script calls
except SystemExit as exc:
    assert exc.code == 0, exc.code
assert "rich" in sys.modules and type(sys.modules["httpx._main"]) is type(sys)
print("ok")
"""
    assert fresh(code).splitlines()[-1] == "ok"


def test_a_deferred_plain_module_is_not_loaded_by_a_from_import_of_a_name_it_calls_later(tmp_path, monkeypatch):
    module = "LOADS = []\nLOADS.append(1)\n\n\ndef main(x):\n    return x + len(LOADS)\n"
    (tmp_path / "tm_called_later.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tm_called_later", raising=False)
    monkeypatch.setitem(deferred.CALLED_LATER, "tm_called_later", ("main",))
    deferred.defer("tm_called_later")
    stand_in = sys.modules["tm_called_later"]
    from tm_called_later import main  # asks the module for `__path__` first: a plain module has none

    assert sys.modules["tm_called_later"] is stand_in and not hasattr(stand_in, "__path__")
    assert main(41) == 42  # loads the real module (its LOADS filled once) and calls its main
    assert sys.modules["tm_called_later"] is not stand_in and sys.modules["tm_called_later"].LOADS == [1]
