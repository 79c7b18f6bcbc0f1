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

import re
from collections.abc import Sequence
from typing import Any, Protocol

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


class ChatMLFormat:
    """ChatML turns (``<|im_start|>role\n...<|im_end|>\n``) after a system turn with ``system_prompt``. Earlier
    turns keep their roles (a system turn in ``history`` is one more system turn, after the shared one). A turn's
    text is tokenised on its own with special tokens split, so a caller's ``<|im_end|>`` is plain text, never a
    turn boundary."""

    START, END = "<|im_start|>", "<|im_end|>"

    def __init__(self, system_prompt: str = SPOKEN_SYSTEM_PROMPT) -> None:
        self.system_prompt = system_prompt

    def preamble(self) -> str:
        return f"{self.START}system\n{self.system_prompt}{self.END}\n"

    def _segments(self, question: str, history: Sequence[dict[str, str]]) -> list[tuple[str, bool]]:
        """(text, is the caller's) pieces of ``turns``."""
        if not question.strip():
            raise ValueError("question must not be empty")
        segments: list[tuple[str, bool]] = []
        for role, text in [*((t["role"], t["content"]) for t in history), ("user", question)]:
            if role not in ("system", "user", "assistant"):
                raise ValueError(f"unknown role {role!r}")
            if text.strip():
                segments += [(f"{self.START}{role}\n", False), (text.strip(), True), (f"{self.END}\n", False)]
        segments.append((f"{self.START}assistant\n", False))
        return segments

    def turns(self, question: str, history: Sequence[dict[str, str]] = ()) -> str:
        return "".join(text for text, _ in self._segments(question, history))

    def encode_turns(self, tokenizer: Any, question: str, history: Sequence[dict[str, str]] = ()) -> list[int]:
        ids: list[int] = []
        for text, from_caller in self._segments(question, history):
            ids += tokenizer.encode(text, add_special_tokens=False, split_special_tokens=from_caller)
        return ids

    def stop_strings(self) -> list[str]:
        return []
