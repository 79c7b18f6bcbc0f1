"""Per-stage sampling parameters, validated with messages that name the field.

A ``SamplingParams`` remembers which fields its caller set (``given``: at construction, by keyword or position, or
assigned later); a stage receives them as ``to_dict()["given"]``, so a stage with a model's own decoding (a Qwen
talker) keeps that decoding for every field the caller left out, ``extra`` alone included."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from omnipipe.api.prompt import check_unicode
from omnipipe.util.field_error import FieldError
from omnipipe.util.options import NoOptions, options_from_dict

MAX_TOP_K = 1_000_000  # more than any vocabulary; larger values only hide mistakes
MAX_MAX_TOKENS = 32_768  # the longest context of the models served here
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes [0, 2**64)


@dataclass
class SamplingParams:
    """Decoding controls for one stage. ``temperature=0`` is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # the stage's own knobs (its StageSpec.extra_params)
    # a thinker's constrained decoding (``stage/structured_output.py``): the answer as JSON
    # (``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": {...}}``), whether and which of the
    # prompt's tools it calls (``"auto"``, ``"none"``, ``"required"`` or ``{"name": ...}``), and how many calls
    response_format: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    logprobs: int | None = None  # each token's log probability, with this many of the likeliest (0-20) beside it

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, name: str, rule: str, value: Any) -> None:
            if not ok:
                raise FieldError(f"sampling_params.{name}", f"{rule}, got {value!r}")

        def number(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        def integer(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        need(number(self.temperature) and 0 <= self.temperature <= 10, "temperature", "must be in [0, 10]",
             self.temperature)
        need(number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p)
        need(integer(self.top_k) and 0 <= self.top_k <= MAX_TOP_K, "top_k", f"must be an integer in [0, {MAX_TOP_K}]",
             self.top_k)
        need(integer(self.max_tokens) and 1 <= self.max_tokens <= MAX_MAX_TOKENS, "max_tokens",
             f"must be an integer in [1, {MAX_MAX_TOKENS}]", self.max_tokens)
        need(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop) and len(self.stop) <= 16,
             "stop", "must be a list of at most 16 non-empty strings", self.stop)
        for text in self.stop:
            check_unicode(text, "sampling_params.stop")
        need(self.seed is None or (integer(self.seed) and 0 <= self.seed < SEED_LIMIT), "seed",
             "must be null or an integer in [0, 2**64)", self.seed)
        need(number(self.repetition_penalty) and 0 < self.repetition_penalty <= 10, "repetition_penalty",
             "must be in (0, 10]", self.repetition_penalty)
        need(number(self.presence_penalty) and -2 <= self.presence_penalty <= 2, "presence_penalty",
             "must be in [-2, 2]", self.presence_penalty)
        need(number(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2, "frequency_penalty",
             "must be in [-2, 2]", self.frequency_penalty)
        need(isinstance(self.extra, dict), "extra", "must be a mapping", self.extra)
        fmt = self.response_format
        need(fmt is None or (isinstance(fmt, dict) and (fmt == {"type": "json_object"} or (
            set(fmt) == {"type", "schema"} and fmt["type"] == "json_schema" and isinstance(fmt["schema"], dict)))),
            "response_format", 'must be null, {"type": "json_object"} or {"type": "json_schema", "schema": {...}}', fmt)
        choice = self.tool_choice
        need(choice in ("auto", "none", "required") or (isinstance(choice, dict) and set(choice) == {"name"}
                                                         and isinstance(choice["name"], str)),
             "tool_choice", 'must be "auto", "none", "required" or {"name": ...}', choice)
        need(isinstance(self.parallel_tool_calls, bool), "parallel_tool_calls", "must be true or false",
             self.parallel_tool_calls)
        need(self.logprobs is None or (integer(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS),
             "logprobs", f"must be null or an integer in [0, {MAX_TOP_LOGPROBS}]", self.logprobs)

    def check_extra(self, schema: type | None) -> None:
        """Check ``extra`` against its stage's knobs (``StageSpec.extra_params``, the dataclass the stage reads them
        with; None: the stage takes none): unknown keys are refused, each value is checked by the schema."""
        options_from_dict(schema or NoOptions, self.extra, "sampling_params.extra")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        given = self.__dict__.get("_given")
        if given is not None and name in _FIELD_NAMES:
            given.add(name)

    @property
    def given(self) -> frozenset[str]:
        """The fields the caller set (the others hold their defaults)."""
        return frozenset(self.__dict__.get("_given", ()))

    def to_dict(self) -> dict[str, Any]:
        """Every field, and ``given``: the names of those the caller set (``stage/sampling.py``'s
        ``given_params`` reads them)."""
        return {**asdict(self), "given": sorted(self.given)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SamplingParams:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise FieldError(f"sampling_params.{unknown[0]}",
                             f"unknown field (expected one of: {', '.join(sorted(known))})")
        return cls(**raw)


_FIELD_NAMES = tuple(f.name for f in fields(SamplingParams))  # in the order __init__ takes them


def _remember_given(init: Any) -> Any:
    @functools.wraps(init)
    def __init__(self: SamplingParams, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.__dict__["_given"] = set(_FIELD_NAMES[:len(args)]) | set(kwargs)

    return __init__


SamplingParams.__init__ = _remember_given(SamplingParams.__init__)  # type: ignore[method-assign]
