"""A task's output bytes as the lines to ship (pure): a newline ends a line; a carriage return ends an update that
the next one overwrites (tqdm, Keras and Lightning redraw their bars so), as does a line ending by moving the cursor
back up (nested tqdm bars). Of a run of updates only the latest is
shipped, at most every UPDATE_EVERY_S, and the last one of the run always: the log store gets the bar's progress,
not every frame of it."""

import math

UPDATE_EVERY_S = 2.0
MAX_LINE_BYTES = 2**20  # a longer line is shipped in pieces of this size
SKIP_TAIL_BYTES = 8192  # of output dropped unsplit, what is kept for the task's last lines
CURSOR_UP = "\x1b[A"  # a nested tqdm bar's frame ends so: the next newline only moves down to draw it again


class OutputSplitter:
    """Feed a stream's bytes as they come; ship what `feed`, `due` and `end` return, in order."""

    def __init__(self, *, every_s: float = UPDATE_EVERY_S) -> None:
        self.every_s = every_s
        self.partial = b""  # the segment not ended yet
        self.held: str | None = None  # the latest update not shipped yet
        self.shipped_at = -math.inf
        self.after_cr = False  # the last segment ended with a carriage return

    def feed(self, data: bytes, now: float) -> list[str]:
        """The lines `data` completes."""
        out: list[str] = []
        buffer, start = self.partial + data, 0
        cr = buffer.find(b"\r")  # looked for again only once passed: each look from every line scanned the rest of
        while True:  # the buffer, a 64-KiB read of short lines with no carriage return was ~2 GB scanned
            if 0 <= cr < start:
                cr = buffer.find(b"\r", start)
            nl = buffer.find(b"\n", start)
            ends = [i for i in (cr, nl) if i >= 0]
            if not ends:
                break
            end = min(ends)
            segment = buffer[start:end].decode(errors="replace")
            if end == nl and not segment.endswith(CURSOR_UP):
                out += self._line(segment)
            else:
                out += self._update(segment, now)
            start = end + 1
        self.partial = buffer[start:]
        while len(self.partial) > MAX_LINE_BYTES:
            out += self._line(self.partial[:MAX_LINE_BYTES].decode(errors="replace"))
            self.partial = self.partial[MAX_LINE_BYTES:]
        return out

    def skip(self, data: bytes) -> tuple[int, bytes] | None:
        """Drop `data` unsplit, up to its last newline (lines over the task's allowance): how many lines it ended and
        the bytes of its last ones (up to `SKIP_TAIL_BYTES`); None where it ends no line (then fed as usual: a
        newline-free stream is cut into few long pieces anyway)."""
        buffer = self.partial + data
        cut = buffer.rfind(b"\n")
        if cut < 0:
            return None
        self.partial, self.held, self.after_cr = buffer[cut + 1 :], None, False
        return buffer.count(b"\n", 0, cut + 1), buffer[max(0, cut - SKIP_TAIL_BYTES) : cut]

    def due(self, now: float) -> list[str]:
        """The held update, once UPDATE_EVERY_S has passed since the last one shipped (a bar that stopped moving)."""
        if self.held is None or now - self.shipped_at < self.every_s:
            return []
        held, self.held, self.shipped_at = self.held, None, now
        return [held]

    def end(self) -> list[str]:
        """What is left when the stream closes: the held update and the unended segment."""
        out = [self.held] if self.held is not None else []
        rest = self.partial.decode(errors="replace")
        self.held, self.partial = None, b""
        return out + ([rest] if rest else [])

    def _update(self, segment: str, now: float) -> list[str]:
        self.after_cr = True
        if not segment.replace(CURSOR_UP, "").strip():  # a bar cleared with spaces, a CR before the first frame
            return []
        self.held = segment
        return self.due(now)

    def _line(self, segment: str) -> list[str]:
        """A newline ends the run of updates: its last one is shipped (a `\\r` then `\\n` leaves it the line)."""
        held, self.held = self.held, None
        after_cr, self.after_cr = self.after_cr, False
        if not segment and after_cr:  # `\r\n`: the update was the line
            return [held] if held is not None else []
        if not segment.strip() and held is not None:
            return [held]
        return ([held] if held is not None else []) + [segment]
