"""Property-based fuzzing of the per-stage request knobs against a real server: chat bodies whose ``omnipipe``
extension is built from the schemas the stages use, and speech bodies whose ``speed`` goes to the talker.

The extension's fields come from ``OmnipipeExtension``; each stage's sampling params from the fields of
``SamplingParams`` and its ``extra`` knobs from the stage's own schema (``StageSpec.extra_params``), all found by
introspection; stage names are the pipeline's plus junk; values mix what the field's type allows with hostile ones
(huge, tiny, negative, NaN and infinite numbers, integers past 64 bits, strings, booleans, lists, objects, null).
Every answer must be a 200 that completes, or a 400 whose ``param`` names a field of the extension (or of the
speech body); never a 5xx. Afterwards the server answers a normal request in full and every stage is idle.

On the toy server, every target of the schemas with mostly hostile values; on the default pipeline (``models``), a
smaller batch over the stages whose runners read their params (the thinker samples with them, the talker reads its
speed), with mostly valid but extreme values so that they reach the runners, and ``max_tokens`` kept small.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnipipe.api.sampling_params import MAX_MAX_TOKENS, MAX_TOP_K, SEED_LIMIT, SamplingParams
from omnipipe.chunk.accumulation import MAX_CHUNK_FRAMES
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.models.registry import get_pipeline
from omnipipe.protocol.openai import OmnipipeExtension, SpeechRequest
from tests.server.conftest import ServerProcess, engines_idle

CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
# toy: examples per target (chat) or in all (speech), a request takes about 0.1 s; default: in all, drawn over every
# target (Hypothesis's first example of a strategy is its simplest, so one per target would say little)
TOY_EXAMPLES = {"complete": 4, "stream": 2, "speech": 60}
DEFAULT_EXAMPLES = {"complete": 40, "stream": 15, "speech": 12}

HOSTILE: list[Any] = [
    1e308, -1e308, 1e25, -1e25, 5e-324, 1e-300, -1e-300, float("nan"), float("inf"), float("-inf"), 2**70, -2**70,
    2**64, 2**64 - 1, 2**63, -5, -1, 0, 1, 0.0, -0.0, 0.5, 4, 4.5, 10, 11, MAX_TOP_K + 1, MAX_MAX_TOKENS + 1,
    MAX_CHUNK_FRAMES + 1, SEED_LIMIT, True, False, None, "", "x", "auto", "1e308", "\u0000", "\udfff", [], [""],
    ["a", 1], ["x"] * 17, {}, {"a": 1}, {"speed": 2}, [[[]]],
]
JUNK_NAMES = st.sampled_from(["", "vocoder", "THINKER", "thinker ", "a.b", "__proto__", "extra", "int", "x" * 300])


def hostile() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(HOSTILE), st.integers(), st.floats(), st.text(max_size=12),
                     st.lists(st.integers() | st.text(max_size=4), max_size=4),
                     st.dictionaries(st.text(max_size=6), st.integers() | st.none(), max_size=3))


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], one_in: int = 4) -> st.SearchStrategy[Any]:
    """``odd`` once in ``one_in`` draws, else ``usual``: most bodies carry one or two bad values, so the checks
    behind the first are reached too."""
    # the odd draw is a middle value: Hypothesis draws the bounds of a range far more often
    return st.integers(0, one_in - 1).flatmap(lambda i: odd if i == one_in // 2 else usual)


def some_of(fields: dict[str, st.SearchStrategy[Any]], most: int = 3) -> st.SearchStrategy[dict[str, Any]]:
    """An object with up to ``most`` of ``fields``."""
    names = st.lists(st.sampled_from(sorted(fields)), max_size=most, unique=True) if fields else st.just([])
    return names.flatmap(lambda chosen: st.fixed_dictionaries({name: fields[name] for name in chosen}))


def of_type(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of the field's own type, mostly small ones (valid or not for its range)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(0, 64) | st.integers(-10, MAX_MAX_TOKENS + 10)
    if annotation is float:
        return st.floats(0, 1) | st.floats(-3, 12)
    if annotation is str:
        return st.text(min_size=1, max_size=8)
    if origin is list:
        return st.lists(of_type(args[0]) if args else hostile(), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), hostile(), max_size=2)
    if args:  # a union (X | None, bool | int, ...)
        return st.one_of(*(st.none() if a is type(None) else of_type(a) for a in args))
    return hostile()


def field_value(annotation: Any, name: str, small_max_tokens: bool) -> st.SearchStrategy[Any]:
    value = mostly(of_type(annotation), hostile())
    if small_max_tokens and name == "max_tokens":  # a valid count stays small on a real model
        return value.map(lambda v: min(v, 4) if type(v) is int and v >= 1 else v)
    return value


def dataclass_fields(schema: type | None) -> dict[str, Any]:
    """A dataclass's fields and their types (none for a stage without knobs)."""
    if schema is None:
        return {}
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in dataclasses.fields(schema)}


def stage_params(pipeline: PipelineSpec, stage: str, small_max_tokens: bool) -> st.SearchStrategy[Any]:
    """A stage's params with up to two fields (and its knobs in ``extra``), mostly of their types."""
    knobs = dataclass_fields(pipeline.stage_extra_schema(stage)) if stage in pipeline.stage_names else {}
    extra = some_of({name: field_value(kind, name, small_max_tokens) for name, kind in knobs.items()}, most=2)
    fields = some_of({name: field_value(kind, name, small_max_tokens)
                      for name, kind in dataclass_fields(SamplingParams).items() if name != "extra"}, most=2)
    return fields | st.tuples(fields, extra).map(lambda pair: {**pair[0], "extra": pair[1]})


Target = tuple[str, ...]


def targets(pipeline: PipelineSpec) -> list[Target]:
    """Where a bad value goes, from the schemas: every SamplingParams field and every ``extra`` knob of every
    stage (and an unknown one), every extension field, a stage the pipeline lacks, a key the extension lacks."""
    out: list[Target] = []
    for stage in pipeline.stage_names:
        out += [("sampling_params", stage, name) for name in dataclass_fields(SamplingParams)]
        knobs = dataclass_fields(pipeline.stage_extra_schema(stage))
        out += [("sampling_params", stage, "extra", name) for name in [*knobs, "unknown_knob"]]
        out.append(("sampling_params", stage))
    out += [(name,) for name in OmnipipeExtension.model_fields]
    out += [("sampling_params", "<junk>"), ("turbo",)]
    return out


def annotation_at(pipeline: PipelineSpec, target: Target) -> Any:
    if target[0] == "sampling_params" and len(target) == 3:
        return dataclass_fields(SamplingParams)[target[2]]
    if target[0] == "sampling_params" and len(target) == 4:
        return dataclass_fields(pipeline.stage_extra_schema(target[1])).get(target[3], Any)
    if target == ("initial_codec_chunk_frames",):
        edges = pipeline.edges_with_option("initial_codec_chunk_frames")
        return dataclass_fields(pipeline.edge_options_schema(edges[0]))["initial_codec_chunk_frames"]
    return Any


def extension_with(pipeline: PipelineSpec, target: Target, small_max_tokens: bool) -> st.SearchStrategy[Any]:
    """An extension whose ``target`` holds a hostile value or one of its type, beside params of the target's stage
    drawn from the schema. On the toy, two draws in three are hostile (the API's checks are the point); on a real
    model (``small_max_tokens``) one in five, so that most requests reach the stages with extreme valid values."""
    typed = of_type(annotation_at(pipeline, target))
    bad = mostly(typed, hostile(), 5) if small_max_tokens else mostly(hostile(), typed, 3)
    if small_max_tokens and target[-1] == "max_tokens":
        bad = bad.map(lambda v: min(v, 4) if type(v) is int and v >= 1 else v)
    stage = target[1] if len(target) > 1 else pipeline.comprehension_stage or pipeline.stage_names[0]

    def build(value: Any, background: dict[str, Any], junk_stage: str) -> dict[str, Any]:
        if target == ("sampling_params", "<junk>"):
            return {"sampling_params": {junk_stage: background}}
        if target[0] != "sampling_params" or len(target) == 1:
            return {target[0]: value, "sampling_params": {stage: background}}
        params = dict(background)
        if len(target) == 2:  # the stage's whole params
            return {"sampling_params": {stage: value}}
        if len(target) == 3:
            params[target[2]] = value
        else:
            params["extra"] = {**(params.get("extra") if isinstance(params.get("extra"), dict) else {}),
                               target[3]: value}
        return {"sampling_params": {stage: params}}

    return st.builds(build, bad, stage_params(pipeline, stage, small_max_tokens), JUNK_NAMES | st.text(max_size=8))


def chat_bodies(pipeline: PipelineSpec, model: str, target: Target, stream: bool,
                small_max_tokens: bool) -> st.SearchStrategy[Any]:
    def body(ext: dict[str, Any], audio: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
                               "max_tokens": 8, "stream": stream, "omnipipe": ext}
        if audio:
            out["modalities"] = ["text", "audio"]
            out["audio"] = {"voice": "default", "format": "pcm16" if stream else "wav"}
        return out

    return st.builds(body, extension_with(pipeline, target, small_max_tokens), st.booleans())


def speech_bodies(model: str) -> st.SearchStrategy[Any]:
    literal = {name: list(typing.get_args(info.annotation)) for name, info in SpeechRequest.model_fields.items()
               if typing.get_origin(info.annotation) is typing.Literal}
    fields = {name: mostly(st.sampled_from(values), hostile()) for name, values in literal.items()}
    fields["speed"] = mostly(st.floats(min_value=0.2, max_value=4.2, allow_nan=False), hostile())
    fields["voice"] = mostly(st.just("default"), hostile())
    fields["instructions"] = mostly(st.text(max_size=8), hostile())
    return st.builds(lambda text, rest: {"model": model, "input": text, **rest},
                     st.sampled_from(["Hi there.", "a\u0000b", "...", "\u00e9t\u00e9"]), some_of(fields))


def post(http: httpx.Client, path: str, body: Any) -> tuple[int, bytes]:
    """The status and the whole body (a stream read to its end)."""
    content = json.dumps(body, allow_nan=True).encode()  # NaN and Infinity too: Python's JSON parser takes them
    with http.stream("POST", path, content=content, headers={"content-type": "application/json"}) as response:
        return response.status_code, response.read()


def check_answer(path: str, body: Any, status: int, data: bytes, params: tuple[str, ...]) -> None:
    shown = json.dumps(body, allow_nan=True)[:1500]
    assert status in (200, 400), f"{path} -> {status}: {data[:500]!r}\n{shown}"
    if status == 400:
        error = json.loads(data)["error"]
        assert error["type"] == "invalid_request_error", (error, shown)
        param = error["param"]
        assert isinstance(param, str) and param.startswith(params), (error, shown)
        assert param in error["message"], (error, shown)
        return
    if path == CHAT and body["stream"]:
        events = [line[len(b"data: "):] for line in data.split(b"\n") if line.startswith(b"data: ")]
        assert events and events[-1] == b"[DONE]", (data[-500:], shown)
        assert not any(b'"error"' in event for event in events), (data[-500:], shown)
    elif path == CHAT:
        assert json.loads(data)["choices"][0]["finish_reason"], (data[:500], shown)
    elif body.get("stream_format") == "sse":
        assert data.rstrip().endswith(b"}") and b"speech.audio.done" in data, (data[-300:], shown)
    else:
        assert data, shown


def fuzz(server: ServerProcess, strategies: list[st.SearchStrategy[Any]], path: str, examples: int,
         params: tuple[str, ...]) -> None:
    """``examples`` bodies from each strategy, every answer checked."""
    with server.client(timeout_s=300) as http:
        for strategy in strategies:
            @given(body=strategy)
            @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(body: Any) -> None:
                status, data = post(http, path, body)
                check_answer(path, body, status, data, params)

            check()


def serves_in_full_and_idles(server: ServerProcess, model: str, answer: str | None) -> None:
    with server.client(timeout_s=300) as http:
        response = http.post(CHAT, json={"model": model, "messages": [{"role": "user", "content": "after fuzzing"}],
                                         "max_tokens": 20, "modalities": ["text", "audio"]})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["audio"]["data"] and message["audio"]["transcript"] and message["content"] is None
    if answer is not None:
        assert message["audio"]["transcript"] == answer
    state = server.wait_idle(timeout_s=60)
    assert engines_idle(state), state
    assert server.process.poll() is None


# ---------------------------------------------------------------------------------------------- toy server
def test_the_targets_are_the_schemas_fields() -> None:
    """What is fuzzed comes from the schemas: every SamplingParams field and every stage's extra knob (found by
    introspection), every extension field."""
    toy = get_pipeline("toy")
    found = targets(toy)
    assert {name for _, stage, *rest in (t for t in found if len(t) == 3) for name in rest} == \
        set(dataclass_fields(SamplingParams)) >= {"temperature", "top_p", "top_k", "max_tokens", "stop", "seed"}
    assert ("sampling_params", "talker", "extra", "speed") in found
    assert ("sampling_params", "thinker", "extra", "fail") in found
    assert ("sampling_params", "code2wav", "extra", "unknown_knob") in found
    assert ("initial_codec_chunk_frames",) in found and ("sampling_params",) in found
    assert len(found) == 3 * (len(dataclass_fields(SamplingParams)) + 2) + 3 + len(OmnipipeExtension.model_fields) + 2


@pytest.mark.parametrize("mode", ["complete", "stream"])
def test_chat_extension_never_gets_a_server_error(toy_server: ServerProcess, mode: str) -> None:
    toy = get_pipeline("toy")
    fuzz(toy_server, [chat_bodies(toy, "toy", target, mode == "stream", False) for target in targets(toy)], CHAT,
         TOY_EXAMPLES[mode], ("omnipipe",))


def test_speech_knobs_never_get_a_server_error(toy_server: ServerProcess) -> None:
    fuzz(toy_server, [speech_bodies("toy")], SPEECH, TOY_EXAMPLES["speech"], tuple(SpeechRequest.model_fields))


def test_toy_server_serves_in_full_after_fuzzing(toy_server: ServerProcess) -> None:
    serves_in_full_and_idles(toy_server, "toy", "AFTER FUZZING")


# ---------------------------------------------------------------------------------------------- default server
@pytest.mark.models
@pytest.mark.parametrize("mode", ["complete", "stream"])
def test_default_chat_extension_never_gets_a_server_error(default_server: ServerProcess, mode: str) -> None:
    default = get_pipeline("default")
    # the stages whose runners read their params: the thinker samples with them, the talker reads its speed
    read = [target for target in targets(default) if target[1:2] in (("thinker",), ("talker",))]
    any_target = st.sampled_from(read).flatmap(
        lambda target: chat_bodies(default, "default", target, mode == "stream", True))
    fuzz(default_server, [any_target], CHAT, DEFAULT_EXAMPLES[mode], ("omnipipe",))


@pytest.mark.models
def test_default_speech_knobs_never_get_a_server_error(default_server: ServerProcess) -> None:
    fuzz(default_server, [speech_bodies("tts")], SPEECH, DEFAULT_EXAMPLES["speech"], tuple(SpeechRequest.model_fields))


@pytest.mark.models
def test_default_server_serves_in_full_after_fuzzing(default_server: ServerProcess) -> None:
    serves_in_full_and_idles(default_server, "default", None)
