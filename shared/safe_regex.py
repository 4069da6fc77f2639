"""Job-supplied regular expressions: compiled by RE2 and matched against bounded lines, so no pattern and no line
can stall a service (RE2 runs in time linear in the line; it has no backreferences or lookarounds to backtrack)."""

from typing import TypeAlias

import re2

MAX_LINE_CHARS = 4096  # a metric sits near the start of an output line; the rest of a huge line is not read
VALUE_GROUP = "value"

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a rejected pattern is the submitter's answer, not a line in our logs

Pattern: TypeAlias = re2._Regexp
Match: TypeAlias = re2._Match


def compile_pattern(regex: str) -> Pattern:
    """The RE2 program of `regex`; ValueError saying why RE2 refuses it."""
    try:
        return re2.compile(regex, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not a valid RE2 regular expression (no backreferences or lookarounds): {reason}") from exc


def value_group(pattern: Pattern) -> str | int:
    """Which group of a metric pattern carries the value: the named group `value`, else its one unnamed group
    (SageMaker's `loss=([0-9.]+)`); ValueError when it has neither."""
    if VALUE_GROUP in pattern.groupindex:
        return VALUE_GROUP
    unnamed = set(range(1, pattern.groups + 1)) - set(pattern.groupindex.values())
    if len(unnamed) != 1:
        raise ValueError(
            "needs the named group `value` (or exactly one unnamed group), e.g. "
            "`loss (?P<value>[0-9.]+)` or `loss=([0-9.]+)`"
        )
    return unnamed.pop()


def compile_metric(regex: str) -> Pattern:
    """A metric pattern: valid under RE2 and with a group that carries the metric (`value_group`)."""
    pattern = compile_pattern(regex)
    value_group(pattern)
    return pattern


def clip(line: str) -> str:
    """The part of a line that patterns are matched against."""
    return line[:MAX_LINE_CHARS]
