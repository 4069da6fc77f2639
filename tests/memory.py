"""An in-memory twin of the few collection operations the services use, for handler tests in milliseconds."""

import copy
from types import SimpleNamespace
from typing import Any

from pymongo import InsertOne, ReplaceOne
from pymongo.errors import BulkWriteError, ClientBulkWriteException, DuplicateKeyError
from pymongo.results import ClientBulkWriteResult


def _values(doc: Any, path: list[str]) -> list[Any]:
    if not path:
        return [doc]
    if isinstance(doc, list | tuple):  # BSON stores a tuple as an array, as it does a list
        return [v for item in doc for v in _values(item, path)]
    if isinstance(doc, dict) and path[0] in doc:
        return _values(doc[path[0]], path[1:])
    return []


def _matches(doc: dict, query: dict) -> bool:
    for key, condition in query.items():
        if key == "$or":
            if not any(_matches(doc, q) for q in condition):
                return False
            continue
        values = _values(doc, key.split("."))
        flat = values + [v for value in values if isinstance(value, list | tuple) for v in value]
        if isinstance(condition, dict) and any(k.startswith("$") for k in condition):
            for op, arg in condition.items():
                checks = {
                    "$gt": lambda v, arg=arg: v is not None and v > arg,
                    "$lt": lambda v, arg=arg: v is not None and v < arg,
                    "$gte": lambda v, arg=arg: v is not None and v >= arg,
                    "$lte": lambda v, arg=arg: v is not None and v <= arg,
                    "$in": lambda v, arg=arg: v in arg,
                    "$ne": lambda v, arg=arg: v != arg,
                    "$nin": lambda v, arg=arg: v not in arg,
                }
                if op == "$exists":
                    if bool(values) != arg:
                        return False
                elif op in ("$ne", "$nin"):
                    if not all(checks[op](v) for v in flat):
                        return False
                elif not any(checks[op](v) for v in flat):
                    return False
        elif condition not in flat and not (condition is None and not values):  # null matches a missing field
            return False
    return True


class Cursor:
    def __init__(self, docs: list[dict]) -> None:
        self.docs = docs

    def sort(self, key, direction: int = 1) -> "Cursor":
        keys = [(key, direction)] if isinstance(key, str) else key
        for name, order in reversed(keys):
            self.docs.sort(key=lambda d: (_values(d, name.split(".")) or [None])[0], reverse=order < 0)
        return self

    def skip(self, n: int) -> "Cursor":
        self.docs = self.docs[n:]
        return self

    def limit(self, n: int) -> "Cursor":
        self.docs = self.docs[:n]
        return self

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        for doc in self.docs:
            yield copy.deepcopy(doc)

    async def to_list(self, length: int | None = None) -> list[dict]:
        return [copy.deepcopy(d) for d in self.docs[:length]]


def _expression(value: Any, doc: dict, names: dict[str, Any]) -> Any:
    """An aggregation expression over `doc`: a field ("$f"), a variable ("$$v"), a literal, or one of the few
    operators the services' pipelines use."""
    if isinstance(value, str) and value.startswith("$$"):
        return names[value[2:]]
    if isinstance(value, str) and value.startswith("$"):
        return (_values(doc, value[1:].split(".")) or [None])[0]
    if not (isinstance(value, dict) and len(value) == 1 and next(iter(value)).startswith("$")):
        return value
    [(op, arg)] = value.items()
    if op == "$filter":
        return [
            item
            for item in _expression(arg["input"], doc, names)
            if _expression(arg["cond"], doc, {**names, arg["as"]: item})
        ]
    args = [_expression(a, doc, names) for a in arg] if isinstance(arg, list) else _expression(arg, doc, names)
    operators: dict[str, Any] = {
        "$cond": lambda a: a[1] if a[0] else a[2],
        "$eq": lambda a: a[0] == a[1],
        "$gte": lambda a: a[0] >= a[1],
        "$lte": lambda a: a[0] <= a[1],
        "$and": all,
        "$size": len,
    }
    return operators[op](args)


def _group(docs: list[dict], spec: dict) -> list[dict]:
    """`$group` with `$sum`, `$max` and `$push` accumulators."""
    groups: dict[Any, dict] = {}
    for doc in docs:
        key = _expression(spec["_id"], doc, {})
        group = groups.setdefault(key, {"_id": key})
        for name, accumulator in spec.items():
            if name == "_id":
                continue
            [(op, arg)] = accumulator.items()
            value = _expression(arg, doc, {})
            if op == "$sum":
                group[name] = group.get(name, 0) + (value or 0)
            elif op == "$max":
                group[name] = value if name not in group else max(group[name], value)
            else:  # $push
                group.setdefault(name, []).append(value)
    return list(groups.values())


def _pipeline(docs: list[dict], pipeline: list[dict]) -> list[dict]:
    """The `$match`, `$group`, `$project` and `$count` stages."""
    for stage in pipeline:
        [(name, spec)] = stage.items()
        if name == "$match":
            docs = [d for d in docs if _matches(d, spec)]
        elif name == "$group":
            docs = _group(docs, spec)
        elif name == "$project":
            docs = [{k: d.get(k) if v == 1 else _expression(v, d, {}) for k, v in spec.items() if v != 0} for d in docs]
        else:  # $count
            docs = [{spec: len(docs)}] if docs else []
    return docs


class Result:
    def __init__(self, matched: int = 0, deleted: int = 0) -> None:
        self.matched_count = self.modified_count = matched
        self.deleted_count = deleted
        self.upserted_id = None


class MemoryClient:
    """The client's `bulk_write` (MongoDB 8.0's command) of the replacements `shared.grouped` sends there, over
    one memory collection: each answered on its own, a duplicate key refusing its own request only."""

    def __init__(self, collection: "MemoryCollection") -> None:
        self.collection = collection

    async def bulk_write(
        self, models: list, ordered: bool = True, verbose_results: bool = False
    ) -> ClientBulkWriteResult:
        results: dict[int, Result] = {}
        errors: list[dict] = []
        for index, model in enumerate(models):
            try:
                results[index] = await self.collection.replace_one(model._filter, model._doc, bool(model._upsert))
            except DuplicateKeyError as exc:
                errors.append({"idx": index, "code": 11000, "errmsg": str(exc)})
                if ordered:
                    break
        details = {"anySuccessful": bool(results), "error": None, "writeErrors": errors, "updateResults": results}
        if errors:
            raise ClientBulkWriteException(details, verbose_results)
        return ClientBulkWriteResult(details, acknowledged=True, has_verbose_results=verbose_results)


class MemoryCollection:
    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.full_name = f"{name}-{id(self)}"  # one of its own, as each collection of a client has
        self.database = SimpleNamespace(client=MemoryClient(self))
        self.docs: dict[Any, dict] = {}

    def find(self, query: dict | None = None, projection: dict | None = None) -> Cursor:
        return Cursor([d for d in self.docs.values() if _matches(d, query or {})])

    async def find_one(self, query: dict, projection: dict | None = None) -> dict | None:
        return next((copy.deepcopy(d) for d in self.docs.values() if _matches(d, query)), None)

    async def insert_one(self, doc: dict) -> Result:
        if doc["_id"] in self.docs:
            raise DuplicateKeyError(f"duplicate _id {doc['_id']}")
        self.docs[doc["_id"]] = copy.deepcopy(doc)
        return Result(1)

    async def insert_many(self, docs: list[dict], ordered: bool = True) -> Result:
        """As MongoDB: a duplicate id stops an ordered insert there; an unordered one inserts the rest and then
        reports each refused document by its index."""
        errors = []
        for index, doc in enumerate(docs):
            try:
                await self.insert_one(doc)
            except DuplicateKeyError:
                errors.append({"index": index, "code": 11000})
                if ordered:
                    break
        if errors:
            raise BulkWriteError({"writeErrors": errors, "nInserted": len(docs) - len(errors)})
        return Result(len(docs))

    async def replace_one(self, query: dict, doc: dict, upsert: bool = False) -> Result:
        current = await self.find_one(query)
        if current is None and not upsert:
            return Result(0)
        key = current["_id"] if current else query["_id"]
        self.docs[key] = {"_id": key, **copy.deepcopy(doc)}
        if current is None:  # as MongoDB says of an upsert's insert
            result = Result(0)
            result.upserted_id = key
            return result
        return Result(1)

    async def update_one(self, query: dict, update: dict, upsert: bool = False) -> Result:
        current = next((d for d in self.docs.values() if _matches(d, query)), None)
        if current is None:
            if not upsert:
                return Result(0)
            if query["_id"] in self.docs:  # as MongoDB: the upsert's insert meets the unmatched document's id
                raise DuplicateKeyError(f"duplicate _id {query['_id']}")
            current = self.docs.setdefault(query["_id"], {"_id": query["_id"]})
            for key, value in update.get("$setOnInsert", {}).items():
                current[key] = copy.deepcopy(value)
        for key, value in update.get("$set", {}).items():
            *parents, leaf = key.split(".")
            target = current
            for part in parents:
                target = target.setdefault(part, {})
            target[leaf] = copy.deepcopy(value)
        for key, value in update.get("$inc", {}).items():
            current[key] = current.get(key, 0) + value
        for key in update.get("$unset", {}):
            current.pop(key, None)
        for key, condition in update.get("$pull", {}).items():
            current[key] = [item for item in current.get(key, []) if not _matches(item, condition)]
        return Result(1)

    async def find_one_and_update(
        self,
        query: dict,
        update: dict,
        projection: dict | None = None,
        upsert: bool = False,
        return_document: bool = False,
    ) -> dict | None:
        """`return_document`: pymongo's ReturnDocument.AFTER is True, BEFORE False."""
        before = next((copy.deepcopy(d) for d in self.docs.values() if _matches(d, query)), None)
        if before is None and not upsert:
            return None
        await self.update_one(query, update, upsert=upsert)
        return await self.find_one({"_id": before["_id"] if before else query["_id"]}) if return_document else before

    async def bulk_write(self, requests: list, ordered: bool = True) -> Result:
        """UpdateOne, ReplaceOne and InsertOne requests (what the services send in bulk), unordered: a duplicate
        key refuses its own request only, reported by index as the server does."""
        errors, matched = [], 0
        for index, request in enumerate(requests):
            try:
                if isinstance(request, InsertOne):
                    await self.insert_one(request._doc)
                elif isinstance(request, ReplaceOne):
                    matched += (
                        await self.replace_one(request._filter, request._doc, bool(request._upsert))
                    ).matched_count
                else:
                    matched += (
                        await self.update_one(request._filter, request._doc, bool(request._upsert))
                    ).matched_count
            except DuplicateKeyError:
                errors.append({"index": index, "code": 11000})
        if errors:
            raise BulkWriteError({"writeErrors": errors})
        return Result(matched)

    async def delete_one(self, query: dict) -> Result:
        doc = await self.find_one(query)
        if doc is None:
            return Result()
        del self.docs[doc["_id"]]
        return Result(deleted=1)

    async def find_one_and_delete(self, query: dict) -> dict | None:
        doc = await self.find_one(query)
        if doc is not None:
            del self.docs[doc["_id"]]
        return doc

    async def delete_many(self, query: dict) -> Result:
        keys = [k for k, d in self.docs.items() if _matches(d, query)]
        for key in keys:
            del self.docs[key]
        return Result(deleted=len(keys))

    async def count_documents(self, query: dict) -> int:
        return sum(1 for d in self.docs.values() if _matches(d, query))

    async def aggregate(self, pipeline: list[dict]) -> Cursor:
        return Cursor(_pipeline([copy.deepcopy(d) for d in self.docs.values()], pipeline))

    async def create_index(self, *args, **kwargs) -> str:
        return "memory"


class Clock:
    """A settable now (aware datetimes), for services that take a `clock`: a test moves time on by hand."""

    def __init__(self, now: Any) -> None:
        self.now = now

    def __call__(self) -> Any:
        return self.now

    def at(self, now: Any) -> "Clock":
        self.now = now
        return self


class ReadCounting(MemoryCollection):
    """A collection that counts the reads a database would answer (finds), for tests of what a service reads."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.reads = 0

    async def find_one(self, query: dict, projection: dict | None = None):
        self.reads += 1
        return await super().find_one(query, projection)

    def find(self, query: dict | None = None, projection: dict | None = None):
        self.reads += 1
        return super().find(query, projection)

    async def replace_one(self, query: dict, doc: dict, upsert: bool = False):
        reads = self.reads  # the in-memory replace finds by a read of its own: no command of the database's
        result = await super().replace_one(query, doc, upsert=upsert)
        self.reads = reads
        return result

    async def delete_one(self, query: dict):
        reads = self.reads  # the in-memory delete finds by a read of its own: no command of the database's
        result = await super().delete_one(query)
        self.reads = reads
        return result
