"""What a thinker request asks of its answer's form, in one per-request object every thinker runner uses: the
grammar that constrains its tokens (JSON, tool calls), the split of its text into content and tool-call pieces,
and the log probabilities of its tokens.

A runner builds one at prefill (``AnswerShape.start``: a ``GrammarError`` there fails the request alone, naming
the field), passes ``constraint`` to the sampler, calls ``accept`` with each token chosen and ``shape`` with each
piece of text its ``TextStream`` lets out; ``shape`` returns the content (the text to show and to speak) and the
``details`` that ride on the step's output: ``{"tool_calls": [pieces]}`` and ``{"logprobs": [entries]}``.
``snapshot`` / ``restore`` go around a step that may be retried."""

from __future__ import annotations

from typing import Any

import torch

from omnipipe.stage.sampling import token_logprobs
from omnipipe.stage.structured_output import GrammarCompiler, TokenConstraint, ToolCallFormat, build_grammar
from omnipipe.stage.tool_call_stream import ToolCallSplitter


class AnswerShape:
    def __init__(self, constraint: TokenConstraint | None, splitter: ToolCallSplitter | None, logprobs: int | None,
                 spell: Any) -> None:
        self.constraint = constraint
        self.splitter = splitter
        self.logprobs = logprobs
        self._spell = spell
        self._pending: list[dict[str, Any]] = []  # logprob entries of tokens whose text has not gone out yet

    @classmethod
    def start(cls, params: dict[str, Any], tools: list[dict[str, Any]], compiler: GrammarCompiler | None,
              fmt: ToolCallFormat | None) -> AnswerShape | None:
        """The shape a request's params and prompt tools ask for; None when they ask for nothing (free text, no
        logprobs). Raises ``GrammarError`` when the grammar cannot be built."""
        response_format = params.get("response_format")
        choice = params.get("tool_choice", "auto")
        logprobs = params.get("logprobs")
        grammar = build_grammar(response_format, tools, choice, bool(params.get("parallel_tool_calls", True)), fmt)
        if grammar is None and logprobs is None:
            return None
        if compiler is None:
            from omnipipe.stage.structured_output import GrammarError

            raise GrammarError("response_format", "this model's stage has no grammar engine")
        constraint = compiler.constraint(grammar) if grammar is not None else None
        calls = fmt is not None and tools and choice != "none"
        return cls(constraint, ToolCallSplitter(fmt) if calls and fmt is not None else None, logprobs,
                   compiler.tokenizer.decode_bytes)

    def accept(self, token: int, logits: torch.Tensor | None, is_text: bool = True) -> None:
        """The token chosen (``logits``: the model's scores it was chosen from, for its logprobs; ``is_text``: not
        an end token)."""
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.logprobs is not None and is_text and logits is not None:
            self._pending.append(token_logprobs(logits, token, self.logprobs, lambda t: self._spell([t])))

    def shape(self, text: str, final: bool) -> tuple[str, dict[str, Any] | None]:
        """The content of ``text`` (the answer's next piece) and the details to send with it."""
        details: dict[str, Any] = {}
        content = text
        if self.splitter is not None:
            content, pieces = self.splitter.feed(text, final=final)
            if pieces:
                details["tool_calls"] = pieces
        if self._pending and (text or final):
            details["logprobs"], self._pending = self._pending, []
        return content, details or None

    @property
    def made_calls(self) -> bool:
        return self.splitter is not None and bool(self.splitter.calls)

    def snapshot(self) -> tuple[Any, ...]:
        return (self.constraint.mark() if self.constraint is not None else 0,
                self.splitter.copy() if self.splitter is not None else None, list(self._pending))

    def restore(self, saved: tuple[Any, ...]) -> None:
        mark, splitter, pending = saved
        if self.constraint is not None:
            self.constraint.rewind(mark)
        self.splitter = splitter.copy() if splitter is not None else None
        self._pending = list(pending)
