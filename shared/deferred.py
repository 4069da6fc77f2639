"""Third-party modules a process loads when it first uses them, not when a library merely imports them."""

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable

# nats-py imports aiohttp (with attrs, yarl, multidict) at its own import for one use, the WebSocket transport of a
# ws:// server URL: every process paid about 0.4 s of CPU at its start for it (a stack starts ten).
# httpx imports its own command line (`httpx._main`, with click, rich and pygments) at its import whenever those are
# installed, as they are where the test extra is (schemathesis brings them): the API, every agent and each CLI
# command paid about 0.15 s of CPU at their start for a command none of them runs.
DEFERRED = ("aiohttp", "httpx._main")
# What a library imports from a deferred module by name at its own import (`from ._main import main`): functions
# that load the real module when they are first called, not when they are imported.
CALLED_LATER: dict[str, tuple[str, ...]] = {"httpx._main": ("main",)}


class Deferred(types.ModuleType):
    """Stands in `sys.modules` for a module not loaded yet: `import name` returns it at no cost; the first read of
    an attribute it lacks loads the real module (which then replaces it there) and answers from it. Each name of
    `called_later` is a function that loads the real module and calls its namesake there."""

    def __init__(self, spec: importlib.machinery.ModuleSpec, called_later: tuple[str, ...] = ()) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec  # what the import system reads of a module already imported: no load for it
        self._deferred_name = spec.name
        self._deferred_package = spec.submodule_search_locations is not None
        for attr in called_later:
            setattr(self, attr, self._forward(attr))

    def _real(self) -> types.ModuleType:
        name = self._deferred_name
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return importlib.import_module(name)

    def _forward(self, attr: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            return getattr(self._real(), attr)(*args, **kwargs)

        call.__name__ = call.__qualname__ = attr
        return call

    def __getattr__(self, attr: str) -> object:
        if attr == "__path__" and not self._deferred_package:
            # what `from .module import name` asks of any module: a plain module has none (no load for that)
            raise AttributeError(attr)
        return getattr(self._real(), attr)


def spec_unloaded(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where `name` is installed, found without importing anything (`importlib.util.find_spec` imports a
    submodule's package, whose own import may be what loads the submodule)."""
    package, _, leaf = name.rpartition(".")
    if not package:
        return importlib.util.find_spec(name)
    parent = spec_unloaded(package)
    if parent is None or parent.submodule_search_locations is None:
        return None
    return importlib.machinery.PathFinder.find_spec(name, list(parent.submodule_search_locations))


def defer(*names: str) -> None:
    """Put a stand-in (`Deferred`) into `sys.modules` for each module installed and not loaded yet."""
    for name in names:
        if name not in sys.modules and (spec := spec_unloaded(name)) is not None:
            sys.modules[name] = Deferred(spec, CALLED_LATER.get(name, ()))
