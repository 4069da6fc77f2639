"""The node ids the minter revoked, which it never mints for again, kept in bounded space: up to `EXACT` of the
newest by name, older ones folded into a Bloom filter of fixed size. Not the last N nor the young ones alone: a
re-granted id could create its command consumer and read what TM_NODE_CMD still keeps for its predecessor (the
stream has no age limit), so no retired id may be forgotten. The filter forgets none; it may take a fresh id for a
retired one and refuse it (fail closed: that rental fails, the next gets another id): about once in 7,000 rentals
once 100,000 ids are folded, once in 150 at 200,000."""

import base64
import hashlib

from shared.buscreds import Minter

EXACT = 5_000  # the newest ids kept by name, ~43 bytes each in the minter file (~215 KB, beside the filter)
FILTER_BITS = 1 << 21  # 256 KiB (~350 KB in the file once the first id is folded)
HASHES = 7


def _bits(node_id: str) -> list[int]:
    digest = hashlib.blake2b(node_id.encode(), digest_size=4 * HASHES).digest()
    return [int.from_bytes(digest[4 * i : 4 * i + 4], "big") % FILTER_BITS for i in range(HASHES)]


def is_retired(minter: Minter, node_id: str) -> bool:
    """Whether the node id was revoked (or, folded, may have been)."""
    if node_id in minter.retired:
        return True
    if not minter.retired_filter:
        return False
    bits = base64.b64decode(minter.retired_filter)
    return all(bits[b // 8] >> (b % 8) & 1 for b in _bits(node_id))


def retire(minter: Minter, node_id: str, *, at: int) -> None:
    """Record the node id as retired; past `EXACT` ids by name, the oldest half folded into the filter (a fold
    rewrites the filter: in batches, not one at each revocation)."""
    minter.retired[node_id] = at
    if len(minter.retired) <= EXACT:
        return
    bits = bytearray(base64.b64decode(minter.retired_filter) if minter.retired_filter else bytes(FILTER_BITS // 8))
    oldest = sorted(minter.retired, key=lambda n: (minter.retired[n], n))[: len(minter.retired) - EXACT // 2]
    for old in oldest:
        for b in _bits(old):
            bits[b // 8] |= 1 << (b % 8)
        del minter.retired[old]
    minter.retired_filter = base64.b64encode(bytes(bits)).decode()
