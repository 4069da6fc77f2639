"""A process does not load aiohttp at its start (nats-py imports it for the WebSocket transport alone), and the
stand-in is the real module from its first use on."""

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
