"""The header parser `shared.natsheaders` gives nats-py: the same answer as nats-py's own on every block tried."""

import random

from nats.aio.client import Client

from shared import natsheaders
from shared.natsheaders import ORIGINAL, parse_header_lines

# What a header block may hold: the separators, every white space character a name may not hold (ASCII's, and the
# ones only `str.isspace` calls white space), bytes that are not ASCII or not UTF-8.
PIECES = [b"Nats-Msg-Id", b"a", b"Z-9", b":", b": ", b" ", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1f", b"\r", b"\n"]
PIECES += [b"\r\n", b"\xc3\xa9", b"\xff", b"value", b"", b"\x00", b"x y", b"::"]


def test_the_same_answer_as_nats_py_on_random_blocks():
    rng = random.Random(7)
    for _ in range(20_000):
        raw = b"".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 14)))
        assert parse_header_lines(raw) == ORIGINAL(raw), raw


def test_a_name_with_any_white_space_character_is_skipped():
    for code in range(128):
        raw = b"Na" + bytes([code]) + b"me: v\r\nok: 1"
        assert parse_header_lines(raw) == ORIGINAL(raw), code
    assert parse_header_lines(b"Nats-Msg-Id: abc\r\nStatus: 404\r\n") == {"Nats-Msg-Id": "abc", "Status": "404"}
    assert parse_header_lines(b"N\x1came: v") == {}  # `str.isspace` white space, not only ASCII's blank ones


def test_installed_on_nats_py_client():
    natsheaders.install()
    assert Client._parse_header_lines(b"a: 1") == {"a": "1"}
    assert Client.__dict__["_parse_header_lines"].__func__ is parse_header_lines
