"""Token ids -> text deltas for one streamed reply, cut at the first stop string.

Text that might be the start of a stop string is held back until the next token settles it,
so a client never receives a stop string (or half of one), as OpenAI's `stop` promises."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """`push(id)` returns the text that is safe to send; `stopped` turns true at a stop
    string (the text before it is sent, the rest dropped); `flush()` returns what is held
    back once generation ends without one. With `decode` (the tokenizer's whole-reply
    decoding), `flush()` also returns what the incremental decoder never will: a reply that
    ends inside a UTF-8 sequence ends in U+FFFD, as the whole reply decodes."""

    def __init__(self, step: Callable[[int], str], stop: Sequence[str] = (),
                 decode: Callable[[Sequence[int]], str] | None = None) -> None:
        self._step = step  # TextTokenizer.stream(): UTF-8-safe incremental decoding
        self.stop = tuple(s for s in stop if s)
        self.stopped = False
        self._held = ""
        self._decode = decode
        self._ids: list[int] = []
        self._sent: list[str] = []

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token)
        buf = self._held + self._step(token)
        cut = min((i for i in (buf.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return buf[:cut]
        keep = _partial_stop(buf, self.stop)
        self._held = buf[len(buf) - keep:] if keep else ""
        self._sent.append(buf[:len(buf) - keep])
        return self._sent[-1]

    def flush(self) -> str:
        out, self._held = self._held, ""
        if self.stopped:
            return ""
        if self._decode is not None:
            sent = "".join(self._sent) + out
            whole = self._decode(self._ids)
            if whole.startswith(sent):  # only an end the incremental decoder held back
                out += whole[len(sent):]
                cut = min((i for i in (out.find(s) for s in self.stop) if i >= 0), default=-1)
                out = out if cut < 0 else out[:cut]
        return out


def _partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that begins some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best
