"""Third-party modules a process loads when it first uses them, not when a library merely imports them."""

import importlib
import importlib.machinery
import importlib.util
import sys
import types

# nats-py imports aiohttp (with attrs, yarl, multidict) at its own import for one use, the WebSocket transport of a
# ws:// server URL: every process paid about 0.4 s of CPU at its start for it (a stack starts ten).
DEFERRED = ("aiohttp",)


class Deferred(types.ModuleType):
    """Stands in `sys.modules` for a module not loaded yet: `import name` returns it at no cost; the first read of
    an attribute it lacks loads the real module (which then replaces it there) and answers from it."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec  # what the import system reads of a module already imported: no load for it
        self._deferred_name = spec.name

    def __getattr__(self, attr: str) -> object:
        name = self._deferred_name
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attr)


def defer(*names: str) -> None:
    """Put a stand-in (`Deferred`) into `sys.modules` for each module installed and not loaded yet."""
    for name in names:
        if name not in sys.modules and (spec := importlib.util.find_spec(name)) is not None:
            sys.modules[name] = Deferred(spec)
