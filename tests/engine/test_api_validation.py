"""Bad arguments to the Python API get clear errors naming the field, and the engine keeps serving."""

from __future__ import annotations

import pytest

from omnipipe import SamplingParams
from tests.conftest import collect


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt": 42}, "prompt: must be a string or a dict"),
    ({"prompt": {"text": "hi"}}, "prompt.text: unknown key"),
    ({"prompt": {"prompt": 5}}, "prompt.prompt: must be a string"),
    ({"prompt": {"prompt": "hi", "multi_modal_data": {"audio": b"x"}}},
     "prompt.multi_modal_data.audio: this pipeline does not accept audio input"),
    ({"prompt": {"prompt": "hi", "multi_modal_data": {"smell": 1}}}, "prompt.multi_modal_data.smell: unknown modality"),
    ({"prompt": "   "}, "prompt: is empty"),
    ({"prompt": {"prompt": "hi", "history": "earlier"}}, "prompt.history: must be a list"),
    ({"prompt": {"prompt": "hi", "history": [{"role": "robot", "content": "x"}]}}, "prompt.history[0].role: must be"),
    ({"prompt": {"prompt": "hi", "history": [{"role": "user", "content": "x"}]}},
     "prompt.history: this pipeline answers one question at a time"),
    ({"prompt": "a\ud800b"}, "prompt: is not valid Unicode text"),
    ({"prompt": {"prompt": "\udfff"}}, "prompt: is not valid Unicode text"),
    ({"prompt": "hi", "sampling_params": {"thinker": {"stop": ["ok", "\ud800"]}}},
     "sampling_params.stop: is not valid Unicode text"),
    ({"prompt": "hi", "output_modalities": ["image"]}, "output_modalities: 'image' is not produced"),
    ({"prompt": "hi", "output_modalities": []}, "output_modalities: must be a non-empty list"),
    ({"prompt": "hi", "sampling_params": {"speaker": SamplingParams()}}, "sampling_params.speaker: no such stage"),
    ({"prompt": "hi", "sampling_params": {"thinker": {"max_tokens": 0}}}, "sampling_params.max_tokens: must be"),
    ({"prompt": "hi", "sampling_params": {"thinker": {"bogus": 1}}}, "sampling_params.bogus: unknown field"),
    ({"prompt": "hi", "sampling_params": "greedy"}, "sampling_params: must be SamplingParams"),
    # a stage's extra knobs are checked against its schema (StageSpec.extra_params) at the API
    ({"prompt": "hi", "sampling_params": {"talker": {"extra": {"speed": 100}}}},
     "sampling_params.extra.speed: must be a number in [0.25, 4], got 100"),
    ({"prompt": "hi", "sampling_params": {"talker": SamplingParams(extra={"speed": "fast"})}},
     "sampling_params.extra.speed: must be a number"),
    ({"prompt": "hi", "sampling_params": {"thinker": {"extra": {"x": 10**25}}}},
     "sampling_params.extra.x: unknown option (expected one of: fail)"),
    ({"prompt": "hi", "sampling_params": {"code2wav": {"extra": {"speed": 1.0}}}},
     "sampling_params.extra.speed: unknown option (none are taken here)"),
    ({"prompt": "hi", "sampling_params": SamplingParams(extra={"fail": "yes"})}, "sampling_params.extra.fail: must be"),
    ({"prompt": "hi", "edge_options": {"talker->code2wav": {"initial_codec_chunk_frames": 0}}},
     'edge_options.talker->code2wav.initial_codec_chunk_frames: must be "auto" or an integer in [1, 4096]'),
    ({"prompt": "hi", "edge_options": {"thinker->talker": {"x": 1}}},
     "edge_options.thinker->talker: no such edge with options"),
    ({"prompt": "hi", "edge_options": {"talker->code2wav": {"initial_codec_chunk_frames": 10**25}}},
     "edge_options.talker->code2wav.initial_codec_chunk_frames: must be"),
    ({"prompt": "hi", "request_id": ""}, "request_id: must be a non-empty string"),
    ({"prompt": "hi", "session_id": ""}, "session_id: must be a non-empty string of at most 256 characters"),
    ({"prompt": "hi", "session_id": "s" * 257}, "session_id: must be a non-empty string of at most 256 characters"),
    ({"prompt": "hi", "session_id": 7}, "session_id: must be a non-empty string"),
])
def test_bad_generate_arguments(toy, kwargs, message) -> None:
    prompt = kwargs.pop("prompt")
    with pytest.raises(ValueError) as excinfo:
        toy.run(collect(toy.engine, prompt, **kwargs))
    assert message in str(excinfo.value)
    assert toy.run(collect(toy.engine, "fine"))[-1].text == "FINE"


def test_a_session_id_is_carried_and_its_end_is_checked(toy) -> None:
    assert toy.run(collect(toy.engine, "fine", session_id="s" * 256))[-1].text == "FINE"
    toy.run(toy.engine.end_session("s" * 256))  # the toy stages keep nothing for it: a no-op
    for bad in ("", None, "s" * 257):
        with pytest.raises(ValueError, match="session_id: must be a non-empty string"):
            toy.run(toy.engine.end_session(bad))
    assert toy.run(collect(toy.engine, "fine"))[-1].text == "FINE"


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 0), ("top_k", -2), ("max_tokens", 1.5),
                                          ("stop", "x"), ("seed", "s"), ("repetition_penalty", 0),
                                          ("presence_penalty", 3)])
def test_sampling_params_validation_names_the_field(field, value) -> None:
    with pytest.raises(ValueError, match=f"sampling_params.{field}"):
        SamplingParams(**{field: value})


def test_duplicate_running_request_id_is_refused(toy) -> None:
    async def run() -> None:
        agen = toy.engine.generate("a long one " * 5, request_id="dup")
        await agen.__anext__()
        try:
            with pytest.raises(ValueError, match="request_id: 'dup' is already running"):
                await collect(toy.engine, "again", request_id="dup")
        finally:
            await agen.aclose()

    toy.run(run())


def test_audio_streams_to_a_pipeline_that_takes_none_are_refused_by_name(toy) -> None:
    import numpy as np

    from omnipipe.engine.async_omni_engine import AudioStreamsNotTakenError

    with pytest.raises(AudioStreamsNotTakenError) as excinfo:
        toy.run(toy.engine.append_audio("s", np.zeros(160, np.float32)))
    assert "takes no audio streams" in str(excinfo.value) and repr(toy.engine.engine.audio_stage) in str(excinfo.value)
    with pytest.raises(ValueError, match="stream_id: must be a non-empty string"):
        toy.run(toy.engine.append_audio("", np.zeros(160, np.float32)))
    assert toy.run(collect(toy.engine, "fine"))[-1].text == "FINE"
