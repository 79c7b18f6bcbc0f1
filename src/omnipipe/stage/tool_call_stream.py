"""A thinker's answer text split into what it says and the tool calls it makes, as the text arrives.

The grammar (``structured_output.py``) makes a turn either an answer or calls written as
``<open>{"name": "NAME", "arguments": ARGS}<close>`` (the family's ``ToolCallFormat``), or one call's JSON alone
(a plain answer never starts with ``{``), so the split needs no guessing: the content goes out as text (and to
the talker, so a call is never spoken); each call goes out as pieces, ``{"index": i, "name": NAME}`` once its
name is complete, then ``{"index": i, "arguments": fragment}`` as its arguments' text arrives, the way OpenAI
streams ``delta.tool_calls``. Text that may still be the start of a marker is held back until the next piece
settles it."""

from __future__ import annotations

import copy
import json
from typing import Any

from omnipipe.stage.structured_output import ToolCallFormat

_NAME_HEAD = '{"name": '
_ARGS_HEAD = ', "arguments": '


class ToolCallSplitter:
    """``feed(text)`` per piece of the answer's text, ``finish()`` once; each returns (content, call pieces)."""

    def __init__(self, fmt: ToolCallFormat) -> None:
        self.open = fmt.open.strip()
        self.close = "}" + fmt.close.rstrip()  # the call object's brace, then the closing marker
        self.buffer = ""
        self.in_call = False
        self.bare = False  # the call is written without markers (the whole answer is its JSON)
        self.started = False  # the answer has begun (a bare call can only be the whole answer)
        self.said = False  # some content went out
        self.name: str | None = None
        self.calls: list[dict[str, str]] = []  # every call so far: {"name", "arguments"}

    def copy(self) -> ToolCallSplitter:
        twin = copy.copy(self)
        twin.calls = [dict(call) for call in self.calls]
        return twin

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        content, pieces = self._feed(text, final)
        self.said = self.said or bool(content.strip())
        return content, pieces

    def _feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.buffer += text
        content, pieces = "", list[dict[str, Any]]()
        while True:
            if not self.in_call and not self.started and self.buffer.lstrip().startswith("{"):
                # the answer is one call's JSON without markers (the grammar lets no plain answer start so)
                self.buffer, self.in_call, self.bare, self.name = self.buffer.lstrip(), True, True, None
            if self.buffer.strip():
                self.started = True
            if not self.in_call:
                at = self.buffer.find(self.open)
                if at < 0:
                    keep = 0 if final else _held_back(self.buffer, self.open)
                    cut = len(self.buffer) - keep
                    if self.calls and not self.buffer[:cut].strip():  # whitespace between or after calls
                        self.buffer = "" if final else self.buffer
                        return content, pieces
                    content += self.buffer[:cut]
                    self.buffer = self.buffer[cut:]
                    return content, pieces
                if not self.calls or self.buffer[:at].strip():  # the separator between two calls is no content
                    content += self.buffer[:at]
                self.buffer = self.buffer[at + len(self.open):].lstrip()
                self.in_call, self.name = True, None
                continue
            if self.name is None:
                name = self._take_name()
                if name is None:
                    return content, pieces
                self.name = name
                self.calls.append({"name": name, "arguments": ""})
                pieces.append({"index": len(self.calls) - 1, "name": name})
                continue
            close = "}" if self.bare else self.close
            end = (len(self.buffer.rstrip()) - 1 if final else -1) if self.bare else self.buffer.find(close)
            cut = end if end >= 0 else len(self.buffer) - (0 if final else _held_back(self.buffer, close, self.bare))
            if cut > 0:
                fragment = self.buffer[:cut]
                self.calls[-1]["arguments"] += fragment
                pieces.append({"index": len(self.calls) - 1, "arguments": fragment})
                self.buffer = self.buffer[cut:]
            if end < 0:
                return content, pieces
            self.buffer = self.buffer[len(close):].lstrip()
            self.in_call = False

    @property
    def calls_so_far(self) -> bool:
        """The turn is calls, or may still be (its first text is held back as a possible marker): a talker that
        speaks token by token leaves out such tokens."""
        return self.in_call or bool(self.calls) or (not self.said and bool(self.buffer.strip()))

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        return self.feed("", final=True)

    def _take_name(self) -> str | None:
        """The call's name once ``{"name": "...", "arguments": `` has all arrived (the rest stays buffered)."""
        self.buffer = self.buffer.lstrip()
        if not self.buffer.startswith(_NAME_HEAD):
            return None
        decoder = json.JSONDecoder()
        try:
            name, end = decoder.raw_decode(self.buffer, len(_NAME_HEAD))
        except ValueError:
            return None
        if not self.buffer.startswith(_ARGS_HEAD, end):
            return None
        self.buffer = self.buffer[end + len(_ARGS_HEAD):]
        return str(name)


def _held_back(text: str, marker: str, bare: bool = False) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker`` (a bare call's closing brace:
    the text's last brace and any whitespace after it, until the answer ends)."""
    if bare:
        stripped = text.rstrip()
        return len(text) - len(stripped) + (1 if stripped.endswith(marker) else 0)
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
