"""``TextStream``: a reply's text streamed token by token equals the whole decode, cut before a stop string and never
showing a piece of one; every token is counted once."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from omnipipe.stage.text_stream import TextStream


@pytest.fixture(scope="module")
def decode():
    """A byte-level BPE tokenizer whose tokens are single bytes (so multi-byte characters span tokens)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    return encode, lambda ids: tokenizer.decode(ids)


def _stream(decode, text: str, stops: list[str]) -> tuple[list[str], list[int], TextStream]:
    encode, dec = decode
    stream = TextStream(dec, stops)
    pieces, units = [], []
    for token in encode(text):
        piece, count = stream.push(token)
        pieces.append(piece)
        units.append(count)
        if stream.stopped:
            break
    piece, count = stream.finish()
    return pieces + [piece], units + [count], stream


@pytest.mark.parametrize("text", ["plain words, and more", "héllo wörld — ünïcode ✓ 日本語 🎉 done", ""])
def test_streamed_text_equals_the_whole_decode(decode, text) -> None:
    pieces, units, stream = _stream(decode, text, [])
    assert "".join(pieces) == text == stream.reply
    assert sum(units) == len(decode[0](text))  # every token counted once
    assert all("\ufffd" not in piece for piece in pieces)  # no half character ever goes out


@pytest.mark.parametrize(("text", "stops", "want"), [
    ("one two. three", ["."], "one two"),
    ("one END two STOP", ["STOP", "END"], "one "),  # the earliest
    ("a STOP b", ["STOP", "TOP"], "a "),  # overlapping stops: the earliest start
    ("never stops", ["zz"], "never stops"),
    ("café 日本 stop", ["日本"], "café "),
])
def test_text_ends_before_the_first_stop_string(decode, text, stops, want) -> None:
    pieces, units, stream = _stream(decode, text, stops)
    assert "".join(pieces) == want and stream.stopped == (want != text)
    for stop in stops:  # no piece sent ever ends with the beginning of a stop string that then followed
        sent = ""
        for piece in pieces:
            sent += piece
            assert stop not in sent
    consumed = len(stream.ids)
    assert sum(units) == consumed


def test_text_that_may_begin_a_stop_string_waits(decode) -> None:
    encode, dec = decode
    stream = TextStream(dec, ["STOP"])
    out = [stream.push(t)[0] for t in encode("go ST")]
    assert "".join(out) == "go "  # "ST" may begin "STOP"
    out = [stream.push(t)[0] for t in encode("AY")]
    assert "".join(out) == "STAY"  # it did not: sent with the letters that settled it
    assert stream.finish() == ("", 0)
    stream = TextStream(dec, ["STOP"])
    assert "".join(stream.push(t)[0] for t in encode("end ST")) == "end "
    assert stream.finish()[0] == "ST"  # the reply ended: what was held goes out


def test_a_copy_returns_to_where_it_was(decode) -> None:
    encode, dec = decode
    stream = TextStream(dec, ["!"])
    for token in encode("héllo"):
        stream.push(token)
    mark = stream.copy()
    for token in encode(" world!"):
        stream.push(token)
    assert stream.stopped and stream.reply == "héllo world"
    assert not mark.stopped and mark.reply == "héllo" and len(mark.ids) == len(encode("héllo"))
    assert "".join(mark.push(t)[0] for t in encode(" there")) == " there"


@pytest.mark.parametrize(("text", "want", "stopped"), [
    (" Paris.\n\nQ: next", "Paris.", True),  # the few-shot format's stops
    (" Paris.\nQ: next", "Paris.", True),
    ("  The sea  is deep.  ", "The sea  is deep.", False),
    ("   ", "", False),
])
def test_strip_sends_no_leading_or_trailing_whitespace(decode, text, want, stopped) -> None:
    from omnipipe.models.default.prompting import stop_strings

    encode, dec = decode
    stream = TextStream(dec, stop_strings(), strip=True)
    pieces = []
    for token in encode(text):
        pieces.append(stream.push(token)[0])
        assert not "".join(pieces).endswith((" ", "\n"))  # whitespace waits for the word after it
        if stream.stopped:
            break
    pieces.append(stream.finish()[0])
    assert "".join(pieces) == want == stream.reply and stream.stopped == stopped
