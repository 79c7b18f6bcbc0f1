"""The embedded default pipeline with the real packaged models, end to end through the engine.

Speech is checked the way a listener would: transcribed by the packaged whisper model and compared with the text
the thinker wrote (word error rate after normalising case and punctuation).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnipipe import SamplingParams
from omnipipe.models.default.modeling.whisper import WhisperASR
from omnipipe.util.audio import word_error_rate
from tests.conftest import EngineHarness, collect, state_is_idle, wait_until_idle

pytestmark = pytest.mark.models

# deterministic speech so async chunk on/off can be compared; greedy text
DETERMINISTIC = {"stages": {"talker": {"options": {"noise_scale": 0.0, "noise_w": 0.0}}}}
PARAMS = SamplingParams(max_tokens=40)
QUESTIONS = [
    "What is the capital of France?",
    "What color is the sky on a clear day?",
    "How many legs does a dog have?",
    "What is water made of?",
]
# an answer of several sentences: async chunk speaks its first piece while the rest is still being written (a
# one-sentence answer leaves little to overlap, and scheduling noise could decide which speaks first)
LONG_ANSWER_QUESTION = "Describe a sunny day at the beach in three sentences."


@pytest.fixture(scope="module")
def asr() -> WhisperASR:
    return WhisperASR(num_threads=2)


@pytest.fixture(scope="module")
def default_on():
    harness = EngineHarness("default", DETERMINISTIC)
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def default_off():
    harness = EngineHarness("default", {**DETERMINISTIC, "async_chunk": False})
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def tts():
    harness = EngineHarness("tts", DETERMINISTIC)
    yield harness
    harness.close()


def speech_matches(asr: WhisperASR, text: str, audio: np.ndarray, rate: int) -> float:
    transcript = asr.transcribe(audio, rate)
    return word_error_rate(text, transcript)


def test_written_question_gets_text_and_matching_speech(default_on, asr) -> None:
    final = default_on.run(collect(default_on.engine, QUESTIONS[0], sampling_params=PARAMS))[-1]
    assert final.finished and final.text.strip()
    assert final.audio is not None and final.audio_duration_s > 0.3
    assert final.sample_rate_hz == 22050
    assert speech_matches(asr, final.text, final.audio, final.sample_rate_hz) <= 0.25, final.text
    m = final.metrics
    assert m.ttft_s is not None and m.ttfp_s is not None and m.rtf is not None
    assert set(m.stages) == {"thinker", "talker", "code2wav"}


def test_spoken_question_reaches_the_thinker(default_on, tts, asr) -> None:
    question = "What is the capital of France?"
    spoken = tts.run(collect(tts.engine, question))[-1]
    assert spoken.audio is not None and spoken.audio.size
    transcript = asr.transcribe(spoken.audio, spoken.sample_rate_hz)
    assert word_error_rate(question, transcript) <= 0.25
    by_voice = default_on.run(collect(default_on.engine, {"prompt": "", "multi_modal_data": {
        "audio": (spoken.audio, spoken.sample_rate_hz)}}, sampling_params=PARAMS))[-1]
    by_text = default_on.run(collect(default_on.engine, transcript, sampling_params=PARAMS))[-1]
    assert set(by_voice.metrics.stages) == {"encoder", "thinker", "talker", "code2wav"}
    assert by_voice.text == by_text.text  # greedy: the same question gives the same answer


def test_async_chunk_on_and_off_agree_and_on_speaks_first(default_on, default_off) -> None:
    on = default_on.run(collect(default_on.engine, LONG_ANSWER_QUESTION, sampling_params=PARAMS))[-1]
    off = default_off.run(collect(default_off.engine, LONG_ANSWER_QUESTION, sampling_params=PARAMS))[-1]
    assert on.text == off.text
    assert abs(on.audio_duration_s - off.audio_duration_s) <= 0.05 * off.audio_duration_s
    assert on.metrics.ttfp_s < off.metrics.ttfp_s
    assert on.metrics.edges["talker->code2wav"]["chunks"] > off.metrics.edges["talker->code2wav"]["chunks"] == 1


def test_four_concurrent_requests_and_an_abort(default_on, asr) -> None:
    async def run() -> tuple[list, BaseException | None]:
        async def victim() -> str | None:
            async for out in default_on.engine.generate("Tell me a long story about a dragon.",
                                                        request_id="victim", sampling_params=PARAMS):
                if out.modality == "audio":
                    await default_on.engine.abort("victim")
                if out.finished:
                    return out.finish_reason
            return None

        results = await asyncio.gather(victim(), *(collect(default_on.engine, q, sampling_params=PARAMS)
                                                   for q in QUESTIONS))
        return list(results[1:]), results[0]

    results, error = default_on.run(run(), timeout_s=600)
    assert error == "abort"  # the victim's stream ended with a final output saying so
    texts, transcripts = [], []
    for outputs in results:
        final = outputs[-1]
        assert final.text.strip() and final.audio is not None and final.audio_duration_s > 0.3
        texts.append(final.text)
        transcripts.append(asr.transcribe(final.audio, final.sample_rate_hz))
    # short answers make a per-answer WER coarse (one misheard word in three is 0.33): judge them together
    assert word_error_rate(" ".join(texts), " ".join(transcripts)) <= 0.25, list(zip(texts, transcripts, strict=True))
    assert max(o[-1].metrics.stages["thinker"]["max_batch_size"] for o in results) > 1
    assert state_is_idle(default_on.run(wait_until_idle(default_on.engine)))


def test_asr_pipeline_transcribes(tts) -> None:
    spoken = tts.run(collect(tts.engine, "Paris is the capital of France."))[-1]
    harness = EngineHarness("asr")
    try:
        final = harness.run(collect(harness.engine, {"multi_modal_data": {"audio": (spoken.audio,
                                                                                   spoken.sample_rate_hz)}}))[-1]
    finally:
        harness.close()
    assert word_error_rate("Paris is the capital of France.", final.text) <= 0.25


@pytest.mark.parametrize("prompt, message", [
    ({"prompt": "hi", "multi_modal_data": {"image": "x.png"}}, "prompt.multi_modal_data.image: file not found: x.png"),
    ({"prompt": "hi", "multi_modal_data": {"video": "x.mp4"}}, "does not accept video input"),
    ({"prompt": "hi", "multi_modal_data": {"smell": "x"}}, "unknown modality"),
    ({"prompt": "", "multi_modal_data": {"audio": np.zeros(100, np.float32)}}, "raw samples need their rate"),
    ({"prompt": "", "multi_modal_data": {"audio": "/no/such/file.wav"}}, "file not found"),
    ({"prompt": "", "multi_modal_data": {"audio": b"not audio at all"}}, "audio"),
    ({"prompt": "", "multi_modal_data": {"audio": (np.zeros(0, np.float32), 16000)}}, "empty"),
])
def test_bad_media_is_refused_before_any_stage(default_on, prompt, message) -> None:
    with pytest.raises(ValueError) as excinfo:
        default_on.run(collect(default_on.engine, prompt))
    assert message in str(excinfo.value)
