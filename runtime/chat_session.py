"""A terminal chat's conversation: the messages so far rendered through the model's chat
template, with the oldest turns dropped (the system message kept) when the next reply would
not fit in the context."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandwich.errors import ConfigError
from sandwich.runtime.tokenizer import TextTokenizer


@dataclass
class ChatSession:
    tok: TextTokenizer
    max_seq: int  # KV positions: prompt + reply must fit
    max_new_tokens: int
    system: str | None = None
    history: list[dict] = field(default_factory=list)
    dropped: int = 0  # turns dropped to fit the context, so far

    def reset(self) -> None:
        self.history.clear()
        self.dropped = 0

    def prompt(self, user_text: str) -> list[int]:
        """The ids of the conversation with `user_text` appended, oldest turns dropped until
        the reply fits; refuses a message that cannot fit even alone."""
        msg = {"role": "user", "content": user_text}
        alone = len(self._ids([msg]))
        if alone + self.max_new_tokens - 1 > self.max_seq:  # refused: the history stays as it was
            raise ConfigError(f"this message takes {alone} tokens; with {self.max_new_tokens} "
                              f"new tokens it does not fit the context of {self.max_seq}; "
                              f"shorten it")
        self.history.append(msg)
        while True:
            ids = self._ids(self.history)
            if len(ids) + self.max_new_tokens - 1 <= self.max_seq:
                return ids
            del self.history[0]  # the oldest turn: a user message and the replies to it
            while len(self.history) > 1 and self.history[0]["role"] != "user":
                del self.history[0]
            self.dropped += 1

    def reply(self, text: str) -> None:
        self.history.append({"role": "assistant", "content": text})

    def _ids(self, messages: list[dict]) -> list[int]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return self.tok.encode(self.tok.render_chat(head + messages))
