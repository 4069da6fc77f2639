"""A group's writes to different collections go out side by side (`shared.grouped._write_group`): the group waits
for the slowest, not for their sum, and each item still gets its own collection's answer."""

import asyncio

from pymongo import InsertOne

from shared import grouped


async def test_a_groups_collections_are_written_side_by_side_and_each_item_answered_by_its_own(monkeypatch):
    sent: list[str] = []
    answer = asyncio.Event()

    async def outcomes(collection: str, requests: list) -> list:
        sent.append(collection)
        await answer.wait()
        return [collection == "refusing"] * len(requests)

    monkeypatch.setattr(grouped, "_outcomes", outcomes)
    monkeypatch.setattr(grouped, "collection_key", lambda collection: (0, collection))
    items = [("audit", [InsertOne({})]), ("refusing", [InsertOne({})]), ("audit", [InsertOne({})])]
    group = asyncio.create_task(grouped._write_group(items))  # type: ignore[arg-type]
    for _ in range(100):  # bounded: both are sent within a few turns of the loop
        if len(sent) == 2:
            break
        await asyncio.sleep(0)
    assert sent == ["audit", "refusing"]  # the second sent before the first was answered
    answer.set()
    assert await group == [False, True, False]
