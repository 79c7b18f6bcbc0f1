"""Constrained decoding's pieces on their own: the grammar of each tool choice, schemas the engine refuses, a
request's grammar state over a real byte-level BPE tokenizer (the tiny Qwen3-Omni one, trained in the test), the
sampler masking one row of a batch and not its neighbour, and the split of a streamed answer into content and
call pieces at every cut."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from omnipipe.stage.answer_shape import AnswerShape, answered_calls
from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, sample_next_tokens
from omnipipe.stage.structured_output import (
    GrammarCompiler,
    GrammarError,
    ToolCallFormat,
    build_grammar,
    check_schema,
)
from omnipipe.stage.tool_call_stream import ToolCallSplitter

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from omnipipe.models.qwen3_omni.weights.tiny import _tokenizer

    return _tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))


def test_the_grammar_follows_the_tool_choice() -> None:
    fmt = ToolCallFormat()
    assert build_grammar(None, [TOOL], "none", True, fmt) is None  # free text: no grammar at all
    assert build_grammar(None, [], "auto", True, fmt) is None
    auto = build_grammar(None, [TOOL], "auto", True, fmt)
    assert auto is not None and auto.startswith("start: answer | calls")
    required = build_grammar(None, [TOOL], "required", True, fmt)
    assert required is not None and required.startswith("start: calls") and "call)*" in required
    single = build_grammar(None, [TOOL], "required", False, fmt)
    assert single is not None and "call)*" not in single
    named = build_grammar(None, [TOOL, {"name": "other"}], {"name": "other"}, True, fmt)
    assert named is not None and '\\"other\\"' in named and "get_weather" not in named
    with pytest.raises(GrammarError) as refused:
        build_grammar(None, [TOOL], "auto", True, None)
    assert refused.value.field == "tools"


@pytest.mark.parametrize(("schema", "reason"), [({"type": "object", "properties": {"a": {"type": "nope"}}}, "nope"),
                                                ({"$ref": "#/nope"}, "nope"), ([1], "must be a JSON schema")])
def test_a_schema_the_engine_refuses_names_the_field_and_why(schema: Any, reason: str) -> None:
    with pytest.raises(GrammarError) as refused:
        check_schema(schema)
    assert refused.value.field == "response_format.json_schema.schema" and reason in refused.value.reason
    check_schema(SCHEMA)


def _allowed(constraint: Any, tokenizer: Any) -> set[str]:
    return {tokenizer.decode([i]) for i in constraint.allowed().nonzero().flatten().tolist()}


def test_a_constraint_follows_tokens_and_rewinds(tokenizer: Any, compiler: GrammarCompiler) -> None:
    grammar = build_grammar({"type": "json_schema", "schema": SCHEMA}, [], "auto", True, None)
    assert grammar is not None
    constraint = compiler.constraint(grammar)
    assert _allowed(constraint, tokenizer) == {"{"}  # the JSON's first character, nothing else
    ids = tokenizer.encode('{"n": 12, "ok": true}', add_special_tokens=False)
    for token in ids[:3]:
        constraint.accept(token)
    mark = constraint.mark()
    for token in ids[3:]:
        constraint.accept(token)
    assert constraint.finished
    assert _allowed(constraint, tokenizer) == {"<|im_end|>"}  # only the end can follow
    constraint.rewind(mark)
    for token in ids[3:]:  # the same tokens again from the mark
        constraint.accept(token)
    with pytest.raises(RuntimeError, match="refused"):
        compiler.constraint(grammar).accept(tokenizer.encode("x", add_special_tokens=False)[0])


def test_the_sampler_masks_a_constrained_row_and_leaves_its_batch_mate(tokenizer: Any,
                                                                       compiler: GrammarCompiler) -> None:
    width = len(tokenizer) + 7  # a checkpoint's logits may be wider than its tokenizer
    grammar = build_grammar({"type": "json_object"}, [], "auto", True, None)
    assert grammar is not None
    logits = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
    free_choice = int(logits[1].argmax())
    rows = [SamplingRow(TokenSamplingParams(), constraint=compiler.constraint(grammar)),
            SamplingRow(TokenSamplingParams())]
    tokens = sample_next_tokens(logits, rows)
    assert tokenizer.decode([tokens[0]]) == "{"
    assert tokens[1] == free_choice
    sampled = [SamplingRow(TokenSamplingParams(temperature=1.0, seed=5),
                           TokenSamplingParams(temperature=1.0, seed=5).make_generator(),
                           constraint=compiler.constraint(grammar))]
    assert tokenizer.decode([sample_next_tokens(logits[:1], sampled)[0]]) == "{"


ANSWER = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"}\\" x"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize("text", [ANSWER, '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                                  "Plain words, {braces} and <tags> stay content."])
def test_the_split_is_the_same_at_every_cut(text: str) -> None:
    def split(pieces: list[str]) -> tuple[str, list[dict[str, str]], list[dict[str, Any]]]:
        splitter = ToolCallSplitter(ToolCallFormat())
        content, streamed = "", []
        for piece in pieces:
            more, calls = splitter.feed(piece)
            content, streamed = content + more, streamed + calls
        more, calls = splitter.finish()
        return content + more, splitter.calls, streamed + calls

    whole = split([text])
    for cut in range(1, len(text)):
        content, calls, pieces = split([text[:cut], text[cut:]])
        assert (content, calls) == whole[:2]
        assert _joined(pieces) == _joined(whole[2])  # the pieces may cut the arguments elsewhere
    chars = split(list(text))
    assert (chars[0], chars[1]) == whole[:2]
    for call in chars[1]:
        json.loads(call["arguments"])
    if text.startswith("Plain"):
        assert whole[0] == text and not whole[1]
    else:
        assert not whole[0].strip() and whole[1]
        names = [piece["name"] for piece in chars[2] if "name" in piece]
        assert names == [call["name"] for call in whole[1]]


def _joined(pieces: list[dict[str, Any]]) -> dict[int, str]:
    """Each call's streamed pieces joined: its name, then its arguments."""
    out: dict[int, str] = {}
    for piece in pieces:
        out[piece["index"]] = out.get(piece["index"], "") + piece.get("name", "") + piece.get("arguments", "")
    return out


def test_only_calls_that_got_results_count_as_answered() -> None:
    history = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "name": "f", "arguments": '{"x": 1, "y": 2}'}, {"id": "b", "name": "g", "arguments": "{}"}]},
        {"role": "tool", "content": "done", "tool_call_id": "a"}]
    assert answered_calls(history) == {("f", '{"x": 1, "y": 2}')}
    shape = AnswerShape(None, ToolCallSplitter(ToolCallFormat()), None, bytes, answered_calls(history))
    shape.shape('{"name": "f", "arguments": {"y": 2, "x": 1}}', final=True)  # the same call, keys reordered
    assert shape.repeats_a_call()


def test_a_retried_step_gives_back_the_call_pieces_it_held() -> None:
    """A turn whose calls wait to be judged holds their pieces; a step undone and retried holds them once."""
    history = [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "f", "arguments": "{}"}]},
               {"role": "tool", "content": "done", "tool_call_id": "a"}]
    shape = AnswerShape(None, ToolCallSplitter(ToolCallFormat()), None, bytes, answered_calls(history))
    assert shape.shape('{"name": "g", "arguments": {"x"', final=False) == ("", None)  # held
    saved = shape.snapshot()
    shape.shape(": 1", final=False)
    shape.restore(saved)  # that step failed: it is retried
    shape.shape(": 1", final=False)
    _, details = shape.shape("}}", final=True)
    assert details is not None
    assert _joined(details["tool_calls"]) == {0: 'g{"x": 1}'}
