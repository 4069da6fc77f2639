"""How long a pull consumer read as the services read theirs (FastStream's loop: nats-py `fetch(batch=32,
timeout=0.5)`, each message handled then acknowledged before the next fetch) takes to hand over a message published
shortly after another, on a real nats-server: the second of two events of a job 40 ms apart, as a state machine
meets `JobSubmitted` then `JobPlaced`. Run: `python -m bench.pullhold --rounds 40` (`--plain`: nats-py's own fetch,
without `shared.pulls`; `--timeout 2`: the state machines' consumers' wait).
"""

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from shared import pulls
from bench.submit import free_port
from services.stack.processes import Stack, StackSettings

BATCH, TIMEOUT_S, HANDLER_S, GAP_S = 32, 0.5, 0.015, 0.04  # shared/bus.py's PullSub for a keyed consumer


async def handed_over(
    stack: Stack, *, rounds: int, batch: int = BATCH, timeout_s: float = TIMEOUT_S, plain: bool = False
) -> list[float]:
    """Milliseconds from each second message's publish to its handler, one pair of messages a round."""
    nc = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()), inbox_prefix="_INBOX_admin")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="HOLD", subjects=["hold.>"]))
    config = ConsumerConfig(durable_name="hold", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=BATCH, ack_wait=10)
    await js.add_consumer("HOLD", config)
    sub = await js.pull_subscribe_bind("hold", stream="HOLD")
    if not plain:
        pulls.adapt(sub)  # as every service's consumers fetch
    seen: dict[bytes, float] = {}

    async def consume() -> None:
        while True:
            try:
                messages = await sub.fetch(batch=batch, timeout=timeout_s)
            except Exception:  # an empty wait
                continue
            for message in messages:
                seen[message.data] = time.monotonic()
                await asyncio.sleep(HANDLER_S)
                await message.ack()

    consumer = asyncio.create_task(consume())
    waits = []
    try:
        for i in range(rounds):
            await asyncio.sleep(random.uniform(0.6, 1.2))  # the consumer idle, at a different point of its wait
            await js.publish("hold.a", f"a{i}".encode())
            await asyncio.sleep(GAP_S)
            sent = time.monotonic()
            await js.publish("hold.b", f"b{i}".encode())
            while f"b{i}".encode() not in seen:
                await asyncio.sleep(0.005)
            waits.append(round((seen[f"b{i}".encode()] - sent) * 1000, 1))
    finally:
        consumer.cancel()
        await nc.close()
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=BATCH, help="messages a fetch asks for (1: nats-py's other path)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="each fetch's wait, seconds")
    parser.add_argument("--plain", action="store_true", help="nats-py's own fetch (shared.pulls not installed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tm-hold-") as tmp:
        stack = Stack(StackSettings(data_dir=Path(tmp), nats_port=free_port(), mongo_url=None, nats_url=None))
        stack.start_nats()
        try:
            waits = asyncio.run(
                handed_over(stack, rounds=args.rounds, batch=args.batch, timeout_s=args.timeout, plain=args.plain)
            )
        finally:
            stack.stop_all()
    held = [w for w in waits if w > 50]
    print(json.dumps({"rounds": len(waits), "held_over_50_ms": len(held), "held_ms": sorted(held), "all_ms": waits}))


if __name__ == "__main__":
    main()
