"""Constrained decoding: what a request asks its answer to be (JSON of a schema, any JSON object, tool calls in its
family's format, or free text), compiled to a grammar with llguidance, and a per-request ``TokenConstraint`` that
masks each step's logits to the tokens the grammar allows and follows the tokens chosen.

The request's ``SamplingParams`` carry the asked shape (``response_format``, ``tool_choice``,
``parallel_tool_calls``); its prompt carries the tools (``prompt.tools``), which the family's prompt renders. The
grammar of a turn with tools is the family's ``ToolCallFormat`` around each call: a call is
``<open>{"name": "NAME", "arguments": ARGS}<close>`` with ARGS the function's parameter schema, so every call's
arguments parse and validate; one call's JSON written alone, without the markers (as small models often do), is a
call too. With ``tool_choice`` ``auto`` the answer is either text (or JSON, with a
``response_format``) or calls; ``required`` or a named function allows calls only. A request without any of these
has no constraint and costs nothing. With tools and no ``response_format``, a plain answer may not start with
``{``: a small model that writes its call's JSON without the call marker would otherwise pass it off as text.

A constraint is per request, so constrained and free requests share a batch: ``sampling.py`` masks only the rows
that carry one. It follows the tokens as ``accept`` is called and can go back (``rewind``) to where a snapshot
marked it, so a step retried alone after a batch failure continues where it stood.

JSON is written with Python's separators (``", "``, ``": "``) and no other whitespace, as the Qwen templates render
tool calls (a model left free to add whitespace can fill its token budget with it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# the whitespace and separators of every JSON value a grammar writes (llguidance's JSON compile options)
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
               "json_allow_general_unicode_escapes": True}
RESPONSE_FORMAT_SCHEMA_FIELD = "response_format.json_schema.schema"


class GrammarError(ValueError):
    """A grammar that could not be compiled: ``field`` names what the caller gave, ``reason`` the engine's word."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    @property
    def engine_field(self) -> str:
        """The field as a stage reports it (``RunnerOutput.error_field``): the prompt's tools or the sampling's
        response_format."""
        return "prompt.tools" if self.field.startswith("tools") else "sampling_params.response_format"


@dataclass(frozen=True)
class ToolCallFormat:
    """How a family writes a tool call: the text around each call's JSON, and the token ids of its markers when
    they are special tokens (llguidance then matches the token itself, never its spelling)."""

    open: str = "<tool_call>\n"
    close: str = "\n</tool_call>"
    separator: str = "\n"  # between two calls
    open_token: int | None = None  # the id of "<tool_call>" when it is one (special) token
    close_token: int | None = None


# How the Qwen templates (Qwen2.5's and Qwen3's alike) list the tools in the system turn: this text, each tool as
# ``tool_json`` on a line of its own, then the instructions for a call
TOOLS_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
               "with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_OUTRO = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")


def tool_json(tool: dict[str, Any]) -> str:
    """A tool as the Qwen templates list it (``tool | tojson``: OpenAI's function form, Python's separators)."""
    return json.dumps({"type": "function", "function": tool}, ensure_ascii=False)


def tool_call_format_for(fmt: ToolCallFormat, tokenizer: Any) -> ToolCallFormat:
    """``fmt`` with the token ids of its markers where the tokenizer has each as one token."""
    from dataclasses import replace

    ids = []
    for marker in ("<tool_call>", "</tool_call>"):
        encoded = tokenizer.encode(marker, add_special_tokens=False)
        ids.append(int(encoded[0]) if len(encoded) == 1 else None)
    return replace(fmt, open_token=ids[0], close_token=ids[1])


def _json_rule(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_STYLE})


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _marker(text: str, token: int | None, marker: str) -> str:
    """A call's opening or closing text in Lark: the special token by id (its spelling as one token), plus the
    text around it."""
    if token is None:
        return _lark_string(text)
    before, _, after = text.partition(marker)
    parts = ([_lark_string(before)] if before else []) + [f"<[{token}]>"] + ([_lark_string(after)] if after else [])
    return " ".join(parts)


def tool_call_grammar_rules(tools: list[dict[str, Any]], fmt: ToolCallFormat, parallel: bool) -> list[str]:
    """Lark rules for one or more calls (``calls``) of ``tools`` ({name, parameters}) in the family's format."""
    rules = []
    names = []
    for i, tool in enumerate(tools):
        params = tool.get("parameters") or {"type": "object", "properties": {}}
        prefix = '{"name": ' + json.dumps(tool["name"]) + ', "arguments": '
        rules.append(f"call_{i}: {_lark_string(prefix)} args_{i} " + _lark_string("}"))
        rules.append(f"args_{i}: {_json_rule(params)}")
        names.append(f"call_{i}")
    open_ = _marker(fmt.open, fmt.open_token, "<tool_call>")
    close = _marker(fmt.close, fmt.close_token, "</tool_call>")
    rules.append(f"body: {' | '.join(names)}")
    rules.append(f"call: {open_} body {close}")
    # one call's JSON alone, without its markers, is a call too: what small models often write
    marked = f"call ({_lark_string(fmt.separator)} call)*" if parallel else "call"
    rules.append(f"calls: {marked} | body")
    return rules


def build_grammar(response_format: dict[str, Any] | None, tools: list[dict[str, Any]], tool_choice: Any,
                  parallel: bool, fmt: ToolCallFormat | None) -> str | None:
    """The Lark grammar of an answer, or None when the answer is free text. ``tool_choice``: ``"none"``,
    ``"auto"``, ``"required"`` or ``{"name": ...}``; tools are not callable with ``"none"``."""
    answer: str | None = None  # the non-call answer's rule body
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_object":
            answer = _json_rule({"type": "object"})
        elif kind == "json_schema":
            answer = _json_rule(response_format["schema"])
    callable_tools = [] if tool_choice == "none" else tools
    if isinstance(tool_choice, dict):
        callable_tools = [t for t in tools if t["name"] == tool_choice["name"]]
    if not callable_tools:
        return None if answer is None else f"start: {answer}\n"
    if fmt is None:
        raise GrammarError("tools", "this model has no tool-call format")
    rules = tool_call_grammar_rules(callable_tools, fmt, parallel and not isinstance(tool_choice, dict))
    if tool_choice == "auto":
        # a plain answer never starts like a call's JSON: a call written without its marker would pass for text
        text = answer if answer is not None else f"TEXT\nTEXT: {_PLAIN_ANSWER}"
        start = "start: answer | calls\nanswer: " + text
    else:
        start = "start: calls"
    return "\n".join([start, *rules]) + "\n"


_PADDING = re.compile(r"\[PAD\d+\]")
# a plain answer of a turn with tools: any text that does not start like a call's JSON (bare or in a code fence)
_PLAIN_ANSWER = r"/(?s:.*)/ & ~/\s*(```[A-Za-z]*\s*)?\{(?s:.*)/"
# the answer of a turn decoded again because it only repeated answered calls: words, not data
WORDS_GRAMMAR = "start: TEXT\nTEXT: " + r"/\s*\w(?s:.*)/" + "\n"


def check_grammar(grammar: str, field: str) -> None:
    """Compile ``grammar`` without a tokenizer (as the server does before a request goes in): a GrammarError
    naming ``field`` with the engine's reason when it cannot."""
    from llguidance import LLMatcher

    problem = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar))
    if problem and not problem.startswith("WARNING"):
        raise GrammarError(field, problem.strip())


def check_schema(schema: Any, field: str = RESPONSE_FORMAT_SCHEMA_FIELD) -> None:
    """A JSON schema as the grammar engine reads it: a GrammarError naming ``field`` when it refuses it."""
    if not isinstance(schema, dict):
        raise GrammarError(field, f"must be a JSON schema object, got {type(schema).__name__}")
    try:
        check_grammar(f"start: {_json_rule(schema)}\n", field)
    except GrammarError:
        raise
    except (TypeError, ValueError) as exc:  # a schema json cannot write (a value that is no JSON)
        raise GrammarError(field, str(exc)) from None


class GrammarCompiler:
    """A stage's grammar engine over its tokenizer. Cheap to make at load: the engine's view of the vocabulary is
    built on the first request that needs it (about a second for a 150k vocabulary), once."""

    def __init__(self, hf_tokenizer: Any, eos_token_id: int | None = None) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.eos_token_id = eos_token_id
        self._tokenizer: Any = None
        self.vocab_size = 0  # the tokenizer's own tokens, once built

    @property
    def tokenizer(self) -> Any:
        """llguidance's tokenizer (built on first use)."""
        return self.ready()._tokenizer

    def ready(self) -> GrammarCompiler:
        """Build the engine's view of the vocabulary now, if it is not built yet."""
        if self._tokenizer is None:
            import llguidance.hf

            hf = self.hf_tokenizer
            # the tokenizer's own tokens: a checkpoint's logits may be wider (Qwen pads 151,665 tokens to 151,936;
            # a tokenizer converted from a GGUF names the padding "[PAD151665]"...): padding ids are never allowed
            vocab_size = len(hf)
            while vocab_size and _PADDING.fullmatch(str(hf.convert_ids_to_tokens(vocab_size - 1))):
                vocab_size -= 1
            self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=self.eos_token_id)
            self.vocab_size = vocab_size
        return self

    def spell(self, token: int) -> bytes:
        """A token's bytes."""
        return bytes(self.tokenizer.decode_bytes([token]))

    def constraint(self, grammar: str) -> TokenConstraint:
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
        if matcher.is_error():
            raise GrammarError("response_format", matcher.get_error())
        return TokenConstraint(matcher, self.vocab_size)


class TokenConstraint:
    """One request's grammar state: ``mask_`` a step's logits row, ``accept`` the token chosen, ``mark`` /
    ``rewind`` around a step that may be retried."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # the tokenizer's tokens; a logits row's ids past them are never allowed
        self.consumed = 0

    def allowed(self) -> torch.Tensor:
        """[vocab_size] bool: the tokens the grammar allows next (an end token once it may end)."""
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return torch.from_numpy(bits[: self.vocab_size].view(np.bool_))

    def mask_(self, row: torch.Tensor) -> torch.Tensor:
        """Set the scores of the tokens the grammar does not allow next to -inf, in place (a [vocab] row of the
        stage's logits)."""
        row.masked_fill_(self.disallowed(row.shape[-1]).to(row.device, non_blocking=True), float("-inf"))
        return row

    def disallowed(self, width: int) -> torch.Tensor:
        """[width] bool: the ids a logits row of ``width`` must not choose next."""
        blocked = torch.ones(width, dtype=torch.bool)
        allowed = self.allowed()[:width]
        blocked[: allowed.shape[0]] = ~allowed
        return blocked

    def accept(self, token: int) -> None:
        """Follow the chosen token (an end token the grammar allows ends it)."""
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        self.consumed += 1

    @property
    def finished(self) -> bool:
        """Nothing but an end token can follow."""
        return bool(self.matcher.is_stopped())

    def mark(self) -> int:
        return self.consumed

    def rewind(self, mark: int) -> None:
        if self.consumed > mark:
            self.matcher.rollback(self.consumed - mark)
            self.consumed = mark
