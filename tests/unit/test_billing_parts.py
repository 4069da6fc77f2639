"""Billing is parts over their own collections: none of them may be missing."""

import dataclasses
import importlib
import pkgutil
import types
import typing

from pymongo.asynchronous.collection import AsyncCollection

from shared.store import DocumentStore
import services.billing


def dataclasses_of_billing() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(services.billing.__path__):
        module = importlib.import_module(f"services.billing.{info.name}")
        found += [
            v
            for v in vars(module).values()
            if dataclasses.is_dataclass(v) and isinstance(v, type) and v.__module__ == module.__name__
        ]
    return found


def test_no_part_of_billing_takes_a_collection_that_may_be_missing():
    optional = []
    for cls in dataclasses_of_billing():
        for name, hint in typing.get_type_hints(cls).items():
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            admits = set(typing.get_args(hint)) if union else {hint}
            if admits & {AsyncCollection, DocumentStore} and type(None) in admits:
                optional.append(f"{cls.__name__}.{name}")
    assert not optional, f"collections that may be None: {optional}"
