"""Few-shot Q/A prompt that makes the base (not instruction-tuned) thinker answer briefly and stop.

The model continues ``Q: ...\\nA:`` with a one-line answer and then a blank line, so
generation stops at the first stop string. The answer text starts with a space
(SentencePiece word prefix); use ``clean_answer`` on the final text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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

MAX_ANSWER_TOKENS = 64
"""A generous cap: answers in this format are usually 5-25 tokens."""

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


def should_stop(text_so_far: str, stops: Sequence[str] = STOP_STRINGS) -> tuple[bool, str]:
    """Whether the generated text contains a stop string, and the text cut before the earliest one."""
    cut = min((index for s in stops if (index := text_so_far.find(s)) != -1), default=-1)
    if cut == -1:
        return False, text_so_far
    return True, text_so_far[:cut]


def stream_safe_length(text_so_far: str, stops: Sequence[str] = STOP_STRINGS) -> int:
    """How many leading characters can be streamed: a trailing partial stop string is held back."""
    stopped, kept = should_stop(text_so_far, stops)
    if stopped:
        return len(kept)
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text_so_far)), 0, -1):
            if text_so_far.endswith(stop[:size]):
                held = max(held, size)
                break
    return len(text_so_far) - held


def clean_answer(text: str) -> str:
    """Final answer text: stop string removed and surrounding whitespace stripped."""
    return should_stop(text)[1].strip()
