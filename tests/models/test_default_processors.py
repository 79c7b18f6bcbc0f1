"""How the default family cuts the thinker's text for the talker, streaming or whole."""

from __future__ import annotations

from omnipipe.chunk.context import ChunkContext
from omnipipe.models.default.processors import (
    SpokenPieceOptions,
    encoder2thinker,
    first_sentence,
    thinker2talker,
    thinker2talker_async_chunk,
)

ANSWER = "The sky on a clear day is blue. It looks nice, really very nice indeed."


def stream(tokens: list[str]) -> list[str]:
    state: dict = {}
    ctx = ChunkContext(SpokenPieceOptions(), active_requests=1, max_num_seqs=8)
    pieces = []
    for i, token in enumerate(tokens):
        pieces += [c["text"] for c in thinker2talker_async_chunk(state, {"text": token}, i == len(tokens) - 1, ctx)]
    return pieces


def test_streaming_speaks_the_first_words_then_sentences_and_clauses() -> None:
    tokens = [" " + w if i else w for i, w in enumerate(ANSWER.split(" "))]
    pieces = stream(tokens)
    assert pieces == ["The sky on a", "clear day is blue.", "It looks nice,", "really very nice indeed."]
    assert " ".join(pieces) == ANSWER


def test_the_first_piece_has_its_words_even_after_an_early_sentence_end() -> None:
    """A sentence end in the first words ("Rome, O.") does not make a first piece of two words (its audio ran out
    before the next piece came); later pieces still end at any sentence end."""
    said = "Rome, O. and Juliet were written by Shakespeare. Yes. He wrote it."
    tokens = [" " + w if i else w for i, w in enumerate(said.split(" "))]
    assert stream(tokens) == ["Rome, O. and Juliet", "were written by Shakespeare.", "Yes.", "He wrote it."]


def test_whole_output_is_cut_into_the_same_pieces() -> None:
    tokens = [" " + w if i else w for i, w in enumerate(ANSWER.split(" "))]
    assert [c["text"] for c in thinker2talker([{"text": t} for t in tokens])] == stream(tokens)


def test_short_answer_is_one_piece_and_empty_answer_none() -> None:
    assert stream(["Yes", "."]) == ["Yes."]
    assert thinker2talker([{"text": "  "}]) == []


def test_transcript_follows_the_written_instruction() -> None:
    assert encoder2thinker([{"text": " what is two plus two", "instruction": "Answer briefly:"}]) == [
        {"text": "Answer briefly: what is two plus two", "history": [], "tools": []}]
    earlier = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]
    tools = [{"name": "get_weather", "parameters": {"type": "object"}}]
    assert encoder2thinker([{"text": "and you?", "instruction": "", "history": earlier, "tools": tools}]) == [
        {"text": "and you?", "history": earlier, "tools": tools}]  # the conversation and its tools go along


def test_a_long_text_is_spoken_a_sentence_at_a_time() -> None:
    assert first_sentence("Hello there, friend. How are you today? Fine.") == (
        "Hello there, friend.", "How are you today? Fine.")
    assert first_sentence("Hi. Mr. Smith is here today.") == ("Hi. Mr. Smith is here today.", "")  # too short
    assert first_sentence("  One sentence only.  ") == ("One sentence only.", "")
    assert first_sentence("no sentence end at all") == ("no sentence end at all", "")
