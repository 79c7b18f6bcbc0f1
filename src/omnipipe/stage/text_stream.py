"""A reply's text as its tokens arrive, for every thinker that streams text: each token decoded once, stop strings
cut out, and nothing sent that could still turn out to be the start of one.

- Detokenising is incremental: a step decodes only the tokens since the last settled piece, together with the piece
  before them (byte-level merges and a leading-space marker come out as in a whole decode), so a long reply costs
  the same per token as a short one. A piece that ends in an incomplete UTF-8 character waits for the next token.
- The text ends before the first stop string, which is not part of it. Text that may begin a stop string is held
  back until the next tokens settle it, so a client never sees a stop string, or half of one, it was promised not
  to see.
- Each piece of text sent carries how many tokens it covers (a token whose text waits is counted with the piece that
  brings it), so a stage's unit count matches the tokens it generated.
- With ``strip``, the reply has no leading or trailing whitespace: whitespace between words goes out with the word
  after it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence


class TextStream:
    """``decode(ids) -> str`` is the tokenizer's decode (special tokens skipped); ``stops`` the request's stop
    strings. ``push(token)`` per generated token that is text (an end token is not pushed), ``finish()`` once."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = (), strip: bool = False) -> None:
        self._decode = decode
        self.stops = [stop for stop in stops if stop]
        self.strip = strip
        self.start = 0  # where the reply begins in ``text`` (past leading whitespace, with ``strip``)
        self.ids: list[int] = []
        self.text = ""  # every settled character decoded so far (a stop string and what follows included)
        self.sent = 0  # characters of ``text`` sent
        self.stopped = False  # a stop string ended the reply
        self._prefix = 0  # ids[_prefix:_read] is the piece decoded last, re-read as context
        self._read = 0
        self._tokens = 0  # tokens pushed and not yet counted with a piece sent

    def push(self, token: int) -> tuple[str, int]:
        """Add a generated token: the text that may go out now (possibly empty) and the tokens it covers. Once a stop
        string has ended the reply, nothing more comes out."""
        if self.stopped:
            return "", 0
        self.ids.append(token)
        self._tokens += 1
        self._settle(final=False)
        return self._ready(final=False)

    def finish(self) -> tuple[str, int]:
        """The reply ended (an end token, the token limit, or a stop string): whatever is held back goes out, an
        incomplete last character included, with the tokens not yet counted."""
        if not self.stopped:
            self._settle(final=True)
        return self._ready(final=True)

    def copy(self) -> TextStream:
        """An independent copy, to return to (a stage's snapshot before a step it may retry)."""
        twin = copy.copy(self)
        twin.ids = list(self.ids)
        return twin

    @property
    def reply(self) -> str:
        """The reply's text as sent so far."""
        return self.text[self.start:self.sent]

    def _settle(self, final: bool) -> None:
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        if len(now) <= len(before) or (now.endswith("\ufffd") and not final):
            return  # nothing new (a special token), or a character still missing its next bytes
        self.text += now[len(before):]
        self._prefix, self._read = self._read, len(self.ids)

    def _ready(self, final: bool) -> tuple[str, int]:
        end = len(self.text)
        cuts = [found for stop in self.stops if (found := self.text.find(stop, self.sent)) >= 0]
        if cuts:
            end, self.stopped = min(cuts), True
        elif not final:
            end -= self._held_back()
        if self.strip:
            if self.sent == self.start:  # nothing sent yet: leading whitespace is not part of the reply
                while self.sent < end and self.text[self.sent].isspace():
                    self.sent += 1
                self.start = self.sent
            end = max(self.sent, self.sent + len(self.text[self.sent:end].rstrip()))
        piece = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        units = 0
        if piece or final or self.stopped:
            units, self._tokens = self._tokens, 0
        return piece, units

    def _held_back(self) -> int:
        """The longest unsent tail of the text that begins some stop string."""
        tail = len(self.text) - self.sent
        held = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, tail), held, -1):
                if self.text.endswith(stop[:size]):
                    held = size
                    break
        return held
