"""What a server reads of the Voxtral pipelines' specs, without a model: a transcription's ``language`` is one of the
pipeline's (Voxtral's eight, the default family's English alone) and goes to the stage that takes it (Voxtral's
thinker; whisper is told none), from the HTTP endpoint and from a realtime session alike; the usage counts the audio
at the pipeline's rate; ``omnipipe models`` says what each pipeline takes, gives, serves and needs. The same through a
real server and model: ``test_voxtral_server.py``."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from omnipipe.api.sampling_params import SamplingParams
from omnipipe.cli.models import serves
from omnipipe.config.pipeline_spec import PipelineSpecError, ServingTraits
from omnipipe.models.registry import get_pipeline
from omnipipe.models.voxtral.options import VoxtralTranscriptionParams
from omnipipe.models.voxtral.weights import load
from omnipipe.server.errors import APIError
from omnipipe.server.routes.realtime.transcription import transcribe
from omnipipe.server.routes.transcription import Transcript, _sampling_params, language_code
from omnipipe.util.field_error import FieldError


def test_a_transcription_takes_the_languages_of_its_pipeline_by_code_or_name() -> None:
    voxtral, whisper = get_pipeline("voxtral_transcribe"), get_pipeline("asr")
    assert [language_code(asked, voxtral) for asked in ("fr", "FR", "German", " hi ", None)] == ["fr", "fr", "de", "hi",
                                                                                            None]
    assert [language_code(asked, whisper) for asked in ("en", "English")] == ["en", "en"]  # as before
    for asked, pipeline in (("ja", voxtral), ("fr", whisper), ("", voxtral)):
        with pytest.raises(APIError) as caught:
            language_code(asked, pipeline)
        assert caught.value.status == 400 and caught.value.param == "language", caught.value.message
    assert "transcribes en (english), es (spanish), fr (french), pt (portuguese), hi (hindi), de (german), " \
           "nl (dutch), it (italian); got 'ja'" in _refusal("ja", voxtral)
    assert "transcribes en (english); got 'fr'" in _refusal("fr", whisper)


def _refusal(asked: str, pipeline: Any) -> str:
    with pytest.raises(APIError) as caught:
        language_code(asked, pipeline)
    return caught.value.message


def test_the_language_goes_to_the_stage_that_takes_it_and_whisper_is_told_none() -> None:
    voxtral, whisper = get_pipeline("voxtral_transcribe"), get_pipeline("asr")
    params = _sampling_params(voxtral, None, None, False, "fr")
    assert params is not None and list(params) == ["thinker"] and params["thinker"].extra == {"language": "fr"}
    params = _sampling_params(whisper, 0.2, None, False, "en")
    assert params is not None and list(params) == ["encoder"] and params["encoder"].extra == {"temperature": 0.2}
    assert _sampling_params(whisper, None, None, False, "en") is None
    assert _sampling_params(voxtral, None, None, False, None) is None
    # the stage checks it: Voxtral's released languages only, and the chat pipeline's thinker takes no language
    SamplingParams(extra={"language": "nl"}).check_extra(voxtral.stage_extra_schema("thinker"))
    with pytest.raises(FieldError) as caught:
        SamplingParams(extra={"language": "ja"}).check_extra(voxtral.stage_extra_schema("thinker"))
    assert caught.value.field == "sampling_params.extra.language"
    with pytest.raises(FieldError) as caught:
        SamplingParams(extra={"language": "fr"}).check_extra(get_pipeline("voxtral").stage_extra_schema("thinker"))
    assert caught.value.field == "sampling_params.extra.language"
    assert VoxtralTranscriptionParams().language is None


def test_a_spec_whose_language_stage_is_unknown_is_refused() -> None:
    voxtral = get_pipeline("voxtral_transcribe")
    with pytest.raises(PipelineSpecError, match="language stage 'talker' unknown"):
        dataclasses.replace(voxtral, serving=ServingTraits(language_param=("talker", "language")))


def test_the_usage_counts_the_audio_at_the_pipelines_rate() -> None:
    def usage(pipeline: str) -> dict[str, Any]:
        transcript = Transcript(get_pipeline(pipeline).serving.audio_tokens_per_s, duration_s=4.0, output_tokens=7)
        return transcript.usage_tokens()

    assert usage("voxtral_transcribe")["input_tokens"] == 50  # 12.5 a second: 375 a 30 s window
    assert usage("voxtral_transcribe")["input_token_details"] == {"audio_tokens": 50, "text_tokens": 0}
    assert usage("voxtral_transcribe")["total_tokens"] == 57
    assert usage("asr")["input_tokens"] == 200  # whisper's encoder, as before: 1500 a window


class _Engine:
    """Records what each transcription asks for; answers ``heard``."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    async def generate(self, prompt: dict[str, Any], *, request_id: str, sampling_params: Any,
                       output_modalities: list[str]) -> AsyncIterator[Any]:
        self.asked.append(sampling_params)
        yield SimpleNamespace(text=" heard ")


class _Pool:
    def __init__(self, pipeline: str) -> None:
        self.engine, self.pipeline = _Engine(), get_pipeline(pipeline)

    async def engine_for(self, endpoint: str) -> tuple[_Engine, Any]:
        assert endpoint == "transcription"
        return self.engine, self.pipeline


def test_a_realtime_session_tells_voxtral_its_transcriptionlanguage_code() -> None:
    audio = np.zeros(2400, np.float32)
    voxtral, whisper = _Pool("voxtral_transcribe"), _Pool("asr")
    assert asyncio.run(transcribe(voxtral, audio, language="en")) == "heard"  # type: ignore[arg-type]
    asyncio.run(transcribe(voxtral, audio))  # type: ignore[arg-type]
    (told, untold) = voxtral.engine.asked
    assert list(told) == ["thinker"] and told["thinker"].extra == {"language": "en"} and untold is None
    asyncio.run(transcribe(whisper, audio, {"fitted_window": True}, language="en"))  # type: ignore[arg-type]
    (fitted,) = whisper.engine.asked
    assert list(fitted) == ["encoder"] and fitted["encoder"].extra == {"fitted_window": True}


def test_omnipipe_models_says_what_each_pipeline_takes_gives_serves_and_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serves(get_pipeline("voxtral")) == "text, audio in -> text out; /v1/audio/transcriptions: voxtral_transcribe"
    assert serves(get_pipeline("voxtral_transcribe")) == ("audio in -> text out; languages: en, es, fr, pt, hi, de, "
                                                          "nl, it")
    assert serves(get_pipeline("asr")) == "audio in -> text out; languages: en"
    assert serves(get_pipeline("toy")) == "text in -> audio, text out; /v1/audio/speech: toy_tts"
    ready, detail = load.weights_status()
    assert ready and all(name in detail for name in ("config.json", "model.safetensors.index.json", "tekken.json",
                                                      "preprocessor_config.json", "not mistral-common"))
    assert load._missing("omnipipe_no_such_package.module") and load._missing("transformers.models.no_such_model")
    monkeypatch.setattr(load, "_missing", lambda module: module == "transformers.models.voxtral")
    ready, detail = load.weights_status()
    assert not ready and detail.startswith("needs transformers with Voxtral (VoxtralForConditionalGeneration): ")
