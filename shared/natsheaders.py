"""nats-py's parser of a message's header lines, the same answer for less: every JetStream delivery carries headers
(its id, ours), and nats-py refused a header name holding white space by testing it one character at a time in a
generator, which was about 5% of the CPU of a service reading the jobs stream (`bench.submit --thread-profile`).
`install` (`shared.bus.make_broker` calls it) gives nats-py's client this parser; a name is refused for the same
characters (`str.isspace`), checked by one search. `tests/unit/test_natsheaders.py` holds it to nats-py's own on
random header blocks.
"""

import re

from nats.aio.client import Client

ORIGINAL = Client.__dict__["_parse_header_lines"].__func__  # nats-py's own (a staticmethod)
CRLF = b"\r\n"
SPACE = re.compile(r"\s")  # on a str, the characters `str.isspace` names (a name here is ASCII)


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """`Name: Value` per line (split on the first `:`); a line without one, a name that is not ASCII or that holds
    white space is skipped; the value stripped and decoded as UTF-8, a malformed byte replaced."""
    out: dict[str, str] = {}
    for line in raw.split(CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if SPACE.search(key):
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


def install() -> None:
    """nats-py's clients in this process parse header lines as above (idempotent)."""
    Client._parse_header_lines = staticmethod(parse_header_lines)  # type: ignore[method-assign]
