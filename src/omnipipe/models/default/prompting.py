"""The thinkers' prompt formats: each is a preamble every prompt shares (its KV cache is computed once) and this
conversation's turns ending in the question.

- ``FewShotFormat`` for a base (not instruction-tuned) model: a few-shot ``Q:``/``A:`` preamble; the model continues
  ``Q: ...\\nA:`` with a one-line answer and then a blank line, so generation stops at the first stop string. The
  answer text starts with a space (SentencePiece word prefix): the thinker streams it stripped
  (``stage/text_stream.py``).
- ``ChatMLFormat`` for an instruct model trained on ChatML (Qwen): a system turn asking for brief spoken answers,
  then ``<|im_start|>user`` / ``<|im_start|>assistant`` turns; the model ends its answer with ``<|im_end|>``, one of
  its end tokens, so there are no stop strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from omnipipe.stage.structured_output import TOOLS_INTRO, TOOLS_OUTRO, ToolCallFormat, tool_json

FEW_SHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by Leonardo da Vinci."),
    ("Hi there!", "Hello! How can I help you today?"),
    ("What is salt made of?", "Table salt is made of sodium and chlorine."),
    ("Tell me about owls.", "Owls are birds that hunt at night. They have large eyes and very good hearing."),
    ("What is 10 minus 3?", "10 minus 3 is 7."),
    ("Who are you?", "I'm a friendly assistant. I answer questions briefly."),
    ("Thanks a lot!", "You're welcome! Happy to help."),
)

STOP_STRINGS: tuple[str, ...] = ("\n\n", "\nQ:", "\nA:")

_WHITESPACE = re.compile(r"\s+")


def build_prompt(question: str, history: Sequence[dict[str, str]] = ()) -> str:
    """The few-shot prompt for ``question`` after ``history`` (newlines are folded to spaces)."""
    preamble, turn = prompt_parts(question, history)
    return preamble + turn


def prompt_parts(question: str, history: Sequence[dict[str, str]] = ()) -> tuple[str, str]:
    """The prompt as (the preamble every prompt shares, this conversation's turns ending in the question), for
    prefix caching. ``history``: ``{"role": "system"|"user"|"assistant", "content": str}`` before the question."""
    question = _fold(question)
    if not question:
        raise ValueError("question must not be empty")
    shots = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in FEW_SHOT_EXAMPLES)
    earlier, unanswered = conversation(history)
    return shots, earlier + f"Q: {' '.join([*unanswered, question])}\nA:"


def conversation(history: Sequence[dict[str, str]]) -> tuple[str, list[str]]:
    """Earlier turns as the template writes them: instructions as notes, questions and answers as Q/A pairs
    (consecutive questions are joined; an answer with no question before it stands alone); and the questions
    after the last answer, which join the one being asked."""
    notes = [_fold(t["content"]) for t in history if t["role"] == "system" and _fold(t["content"])]
    out = "".join(f"Note: {note}\n\n" for note in notes)
    question: list[str] = []
    for turn in history:
        text = _fold(turn["content"])
        if not text or turn["role"] == "system":
            continue
        if turn["role"] == "user":
            question.append(text)
            continue
        out += (f"Q: {' '.join(question)}\n" if question else "") + f"A: {text}\n\n"
        question = []
    return out, question


def _fold(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def stop_strings() -> list[str]:
    """Generation ends at the first of these; they are not part of the answer."""
    return list(STOP_STRINGS)


class PromptFormat(Protocol):
    """How a thinker's prompt is written and tokenised."""

    def preamble(self) -> str:
        """The text every prompt starts with (its tokens are the cached shared prefix)."""
        ...

    def turns(self, question: str, history: Sequence[dict[str, str]] = ()) -> str:
        """The conversation after the preamble, ending where the model writes its answer."""
        ...

    def encode_turns(self, tokenizer: Any, question: str, history: Sequence[dict[str, str]] = ()) -> list[int]:
        """The token ids of ``turns``, to follow the preamble's."""
        ...

    def stop_strings(self) -> list[str]:
        """Generation ends at the first of these (besides the model's end tokens); they are not part of the answer."""
        ...


class FewShotFormat:
    """The few-shot ``Q:``/``A:`` format above, for a base model."""

    def preamble(self) -> str:
        return prompt_parts("x")[0]

    def turns(self, question: str, history: Sequence[dict[str, str]] = ()) -> str:
        return prompt_parts(question, history)[1]

    def encode_turns(self, tokenizer: Any, question: str, history: Sequence[dict[str, str]] = ()) -> list[int]:
        return list(tokenizer.encode(self.turns(question, history), add_special_tokens=False))

    def stop_strings(self) -> list[str]:
        return stop_strings()


SPOKEN_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Your answers are spoken aloud, so answer in one or two short, plain "
    "sentences: no lists, no markdown, no code."
)


def call_json(call: dict[str, str]) -> str:
    """A call an earlier assistant turn made, as the template writes it back."""
    return json.dumps({"name": call["name"], "arguments": json.loads(call["arguments"])}, ensure_ascii=False)


_FORMAT_TOKENS = re.compile(r"(<\|im_start\|>|<\|im_end\|>|<tool_call>|</tool_call>)")


def _encode_as_one_text(tokenizer: Any, segments: list[tuple[str, bool]]) -> list[int]:
    """The tokens of the segments' text as the template's whole text tokenises (so the prompt is the one the chat
    template gives, token for token), except that only the format's own markers are special tokens: the caller's
    text is tokenised with special tokens split, so a ``<|im_end|>`` in it is plain text."""
    ids: list[int] = []
    run = ""
    for text, from_caller in segments:
        if from_caller:
            run += text
            continue
        for part in _FORMAT_TOKENS.split(text):
            if _FORMAT_TOKENS.fullmatch(part):
                if run:
                    ids += tokenizer.encode(run, add_special_tokens=False, split_special_tokens=True)
                    run = ""
                ids.append(int(tokenizer.convert_tokens_to_ids(part)))
            else:
                run += part
    if run:
        ids += tokenizer.encode(run, add_special_tokens=False, split_special_tokens=True)
    return ids


class ChatMLFormat:
    """ChatML turns (``<|im_start|>role\n...<|im_end|>\n``) after a system turn with ``system_prompt``. Earlier
    turns keep their roles (a system turn in ``history`` is one more system turn, after the shared one). A turn's
    text is tokenised on its own with special tokens split, so a caller's ``<|im_end|>`` is plain text, never a
    turn boundary.

    With tools, the turns are written as Qwen2.5's own chat template writes them: the system turn lists the tools
    (its text the caller's first system message when the conversation starts with one, else ``system_prompt``);
    an assistant turn that made calls writes each as ``<tool_call>...</tool_call>``; consecutive tool results
    are one user turn of ``<tool_response>`` blocks; a conversation that ends with a tool's result has the model
    go on from it (no question)."""

    START, END = "<|im_start|>", "<|im_end|>"
    tool_calls = ToolCallFormat()  # Qwen's <tool_call> format (its token ids are the tokenizer's)

    def __init__(self, system_prompt: str = SPOKEN_SYSTEM_PROMPT) -> None:
        self.system_prompt = system_prompt

    def preamble(self) -> str:
        return f"{self.START}system\n{self.system_prompt}{self.END}\n"

    def _tools_preamble(self, tools: Sequence[dict[str, Any]], system: str) -> list[tuple[str, bool]]:
        listed = "".join("\n" + tool_json(tool) for tool in tools)
        return [(f"{self.START}system\n", False), (system, True), (f"\n\n{TOOLS_INTRO}", False), (listed, True),
                (f"{TOOLS_OUTRO}{self.END}\n", False)]

    def _segments(self, question: str, history: Sequence[dict[str, Any]],
                  tools: Sequence[dict[str, Any]] = ()) -> list[tuple[str, bool]]:
        """(text, is the caller's) pieces of ``turns`` (with ``tools``: the system turn too)."""
        answers_a_call = bool(history) and history[-1]["role"] == "tool"
        if not question.strip() and not answers_a_call:
            raise ValueError("question must not be empty")
        segments: list[tuple[str, bool]] = []
        turns = [*history, {"role": "user", "content": question}]
        if tools:
            system = self.system_prompt
            if turns[0]["role"] == "system":
                system, turns = turns[0]["content"], turns[1:]
            segments += self._tools_preamble(tools, system)
        for i, turn in enumerate(turns):
            role, text = turn["role"], turn["content"]
            if role not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"unknown role {role!r}")
            if role == "tool":
                if i == 0 or turns[i - 1]["role"] != "tool":
                    segments.append((f"{self.START}user", False))
                segments += [("\n<tool_response>\n", False), (text, True), ("\n</tool_response>", False)]
                if i + 1 == len(turns) or turns[i + 1]["role"] != "tool":
                    segments.append((f"{self.END}\n", False))
            elif role == "assistant" and turn.get("tool_calls"):
                segments.append((f"{self.START}assistant", False))
                if text.strip():
                    segments += [("\n", False), (text.strip(), True)]
                for call in turn["tool_calls"]:
                    segments += [("\n<tool_call>\n", False), (call_json(call), True), ("\n</tool_call>", False)]
                segments.append((f"{self.END}\n", False))
            elif text.strip():
                segments += [(f"{self.START}{role}\n", False), (text.strip(), True), (f"{self.END}\n", False)]
        segments.append((f"{self.START}assistant\n", False))
        return segments

    def turns(self, question: str, history: Sequence[dict[str, Any]] = (),
              tools: Sequence[dict[str, Any]] = ()) -> str:
        return "".join(text for text, _ in self._segments(question, history, tools))

    def encode_turns(self, tokenizer: Any, question: str, history: Sequence[dict[str, Any]] = (),
                     tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        segments = self._segments(question, history, tools)
        if tools:
            return _encode_as_one_text(tokenizer, segments)
        ids: list[int] = []
        for text, from_caller in segments:
            ids += tokenizer.encode(text, add_special_tokens=False, split_special_tokens=from_caller)
        return ids

    def stop_strings(self) -> list[str]:
        return []
