"""What a thinker request asks of its answer's form, in one per-request object every thinker runner uses: the
grammar that constrains its tokens (JSON, tool calls), the split of its text into content and tool-call pieces,
and the log probabilities of its tokens.

A runner builds one at prefill (``AnswerShape.start``: a ``GrammarError`` there fails the request alone, naming
the field), passes ``constraint`` to the sampler, calls ``accept`` with each token chosen and ``shape`` with each
piece of text its ``TextStream`` lets out; ``shape`` returns the content (the text to show and to speak) and the
``details`` that ride on the step's output: ``{"tool_calls": [pieces]}`` and ``{"logprobs": [entries]}``.
``snapshot`` / ``restore`` go around a step that may be retried.

Small models call a tool whenever one is offered, even right after its result came back, so an agent's loop
would never end. A turn with ``tool_choice`` ``auto`` whose calls all repeat calls the conversation already made
and got results for (same function, same arguments) is decoded again as an answer: the runner starts the turn
again from the conversation without the tools on offer, and ``answer_instead`` takes the calls away. Its call
pieces are held until the turn ends, so nothing of a repeated call reaches the caller."""

from __future__ import annotations

import json
from typing import Any

import torch

from omnipipe.stage.sampling import token_logprobs
from omnipipe.stage.structured_output import (
    WORDS_GRAMMAR,
    GrammarCompiler,
    TokenConstraint,
    ToolCallFormat,
    build_grammar,
)
from omnipipe.stage.tool_call_stream import ToolCallSplitter


class AnswerShape:
    def __init__(self, constraint: TokenConstraint | None, splitter: ToolCallSplitter | None, logprobs: int | None,
                 spell: Any, answered: set[tuple[str, str]] | None = None) -> None:
        self.constraint = constraint
        self.splitter = splitter
        self.logprobs = logprobs
        self._spell = spell
        self._pending: list[dict[str, Any]] = []  # logprob entries of tokens whose text has not gone out yet
        # the calls the conversation already made and got results for: a turn that would only repeat one is
        # decoded again as an answer (``repeats_a_call``); its call pieces wait for the turn's end to be judged
        self.answered = answered or set()
        self._held: list[dict[str, Any]] = []
        self.redone = False

    @classmethod
    def start(cls, params: dict[str, Any], tools: list[dict[str, Any]], compiler: GrammarCompiler,
              fmt: ToolCallFormat | None, history: list[dict[str, Any]] | None = None) -> AnswerShape | None:
        """The shape a request's params and prompt tools ask for; None when they ask for nothing (free text, no
        logprobs: the grammar engine is not touched). Raises ``GrammarError`` when the grammar cannot be built
        (its ``engine_field`` names the field for the stage's error)."""
        response_format = params.get("response_format")
        choice = params.get("tool_choice", "auto")
        logprobs = params.get("logprobs")
        grammar = build_grammar(response_format, tools, choice, bool(params.get("parallel_tool_calls", True)), fmt)
        if grammar is None and logprobs is None:
            return None
        constraint = compiler.constraint(grammar) if grammar is not None else None
        splitter = ToolCallSplitter(fmt) if fmt is not None and tools and choice != "none" else None
        answered = answered_calls(history or []) if choice == "auto" else set()
        return cls(constraint, splitter, logprobs, compiler.spell, answered)

    def answer_instead(self, compiler: GrammarCompiler, response_format: dict[str, Any] | None,
                       fmt: ToolCallFormat | None) -> None:
        """Start the turn again as an answer without calls (the one it wrote only repeated an answered call)."""
        grammar = build_grammar(response_format, [], "none", False, fmt) or WORDS_GRAMMAR
        self.constraint = compiler.constraint(grammar)
        self.splitter = None
        self._pending, self._held, self.answered, self.redone = [], [], set(), True

    def repeats_a_call(self) -> bool:
        """The finished turn made calls, each one the conversation already made and got the result of."""
        if self.splitter is None or not self.splitter.calls or not self.answered:
            return False
        return all((call["name"], canonical_arguments(call["arguments"])) in self.answered
                   for call in self.splitter.calls)

    def accept(self, token: int, logits: torch.Tensor | None, is_text: bool = True) -> None:
        """The token chosen (``logits``: the model's scores it was chosen from, for its logprobs; ``is_text``: not
        an end token)."""
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.logprobs is not None and is_text and logits is not None:
            self._pending.append(token_logprobs(logits, token, self.logprobs, self._spell))

    def shape(self, text: str, final: bool) -> tuple[str, dict[str, Any] | None]:
        """The content of ``text`` (the answer's next piece) and the details to send with it."""
        details: dict[str, Any] = {}
        content = text
        if self.splitter is not None:
            content, pieces = self.splitter.feed(text, final=final)
            if self.answered:  # judged at the turn's end
                self._held += pieces
                pieces = self._held if final else []
            if pieces:
                details["tool_calls"] = pieces
        if self._pending and (text or final):
            details["logprobs"], self._pending = self._pending, []
        return content, details or None

    @property
    def made_calls(self) -> bool:
        return self.splitter is not None and bool(self.splitter.calls)

    def snapshot(self) -> tuple[Any, ...]:
        # a redone turn is not snapshotted apart: a retried step of it starts it again as it was started
        return (self.constraint.mark() if self.constraint is not None else 0,
                self.splitter.copy() if self.splitter is not None else None, list(self._pending), list(self._held))

    def restore(self, saved: tuple[Any, ...]) -> None:
        mark, splitter, pending, held = saved
        if self.constraint is not None:
            self.constraint.rewind(mark)
        self.splitter = splitter.copy() if splitter is not None else None
        self._pending, self._held = list(pending), list(held)


def canonical_arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def answered_calls(history: Any) -> set[tuple[str, str]]:
    """(name, arguments) of every call in ``history`` that a tool turn answered."""
    results = {turn.get("tool_call_id") for turn in history if turn.get("role") == "tool"}
    return {(call["name"], canonical_arguments(call["arguments"])) for turn in history
            for call in turn.get("tool_calls") or [] if call["id"] in results}
