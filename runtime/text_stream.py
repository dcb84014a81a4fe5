"""Token ids -> text deltas for one streamed reply, cut at the first stop string.

Text that might be the start of a stop string is held back until the next token settles it,
so a client never receives a stop string (or half of one), as OpenAI's `stop` promises."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """`push(id)` returns the text that is safe to send; `stopped` turns true at a stop
    string (the text before it is sent, the rest dropped); `flush()` returns what is held
    back once generation ends without one."""

    def __init__(self, step: Callable[[int], str], stop: Sequence[str] = ()) -> None:
        self._step = step  # TextTokenizer.stream(): UTF-8-safe incremental decoding
        self.stop = tuple(s for s in stop if s)
        self.stopped = False
        self._held = ""

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        buf = self._held + self._step(token)
        cut = min((i for i in (buf.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return buf[:cut]
        keep = _partial_stop(buf, self.stop)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return "" if self.stopped else out


def _partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that begins some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best
