"""``semantic_vad``: the end-of-turn model (Smart Turn v3.2, fetched by ``omnipipe download``) heard on the packaged
voice, the VAD it drives, and a realtime session under it.

A thinking pause after a filler ("What is the capital of, um," ... "Italy?") is the case tested: the tts voice
says a fragment alone with a sentence's closing melody, and the model hears that as a finished turn (so does a
person, mostly); what marks an unfinished turn in its speech is the filler."""

from __future__ import annotations

import numpy as np
import pytest

from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.protocol.realtime import SEMANTIC_TURN_END_MS
from omnipipe.server.end_of_turn import EndOfTurnModel
from omnipipe.server.vad import MODEL_RATE_HZ, SileroVAD, TurnEnd, VadEvent
from omnipipe.util.audio import resample
from tests.server.conftest import ServerProcess, spoken
from tests.server.test_realtime import of, session, silence
from tests.server.test_realtime_voice_turn import clip, stream, words

pytestmark = pytest.mark.models

PAUSED = [("What is the capital of, um,", "Italy?"), ("How many legs does, uh,", "a spider have?"),
          ("Who wrote, um,", "Romeo and Juliet?"), ("What is the largest planet in, um,", "our solar system?")]
RIGHT = [("rome",), ("8", "eight"), ("shakespeare",), ("jupiter",)]  # a word of each right answer
WHOLE = ["What is the capital of Italy?", "How many legs does a spider have?", "Who wrote Romeo and Juliet?",
         "What is the largest planet in our solar system?", "What color is the sky on a clear day?"]


@pytest.fixture(scope="module")
def model() -> EndOfTurnModel:
    return EndOfTurnModel()


def _at_16k(text: str, quiet_s: float = 0.1) -> np.ndarray:
    return np.concatenate([spoken(text, 16_000, steady=True), np.zeros(int(16_000 * quiet_s), np.float32)])


def test_the_model_hears_finished_questions_as_complete_and_a_filler_as_unfinished(model: EndOfTurnModel) -> None:
    complete = [model.probability(_at_16k(text)) for text in WHOLE]
    unfinished = [model.probability(_at_16k(head)) for head, _ in PAUSED]
    assert sum(p >= 0.5 for p in complete) >= len(WHOLE) - 1, complete  # judged together: one miss allowed
    assert all(p < 0.5 for p in unfinished), unfinished
    assert min(complete) > max(unfinished) or np.mean(complete) - np.mean(unfinished) > 0.5


def _turns(head: str, tail: str, pause_s: float, turn_end: TurnEnd | None,
           silence_ms: int = 500) -> list[VadEvent]:
    """The VAD's speech_stopped events for ``head``, a pause, ``tail`` and a second of quiet (the 16 kHz stream a
    session's 24 kHz input is resampled to)."""
    audio = np.concatenate([silence(0.3), spoken(head, steady=True), silence(pause_s), spoken(tail, steady=True),
                            silence(1.0 if turn_end is None else turn_end.unfinished_ms / 1000 + 0.5)])
    audio = resample(audio, PCM16_RATE_HZ, MODEL_RATE_HZ)
    vad = SileroVAD(0.5, silence_ms, 300, pause_ms=128, turn_end=turn_end)
    events = [event for start in range(0, len(audio), 640) for event in vad.feed(audio[start:start + 640])]
    return [event for event in events if event.kind == "speech_stopped"]


def _semantic(model: EndOfTurnModel, eagerness: str) -> TurnEnd:
    return TurnEnd(model, *SEMANTIC_TURN_END_MS[eagerness])


def test_a_thinking_pause_ends_the_turn_under_server_vad_and_not_under_semantic_vad(model: EndOfTurnModel) -> None:
    cut = [len(_turns(head, tail, 0.8, None)) for head, tail in PAUSED]
    whole = [len(_turns(head, tail, 0.8, _semantic(model, "auto"))) for head, tail in PAUSED]
    assert cut == [2] * len(PAUSED), cut  # server VAD, 500 ms: every question cut in two, as documented
    assert whole == [1] * len(PAUSED), whole


def test_eagerness_sets_how_long_a_pause_may_last_and_how_soon_a_finished_turn_ends(model: EndOfTurnModel) -> None:
    head, tail = PAUSED[0]
    cuts = {eagerness: len(_turns(head, tail, 1.2, _semantic(model, eagerness))) - 1
            for eagerness in ("high", "auto", "low")}
    # a 1.2 s pause: only high cuts the turn (at it, and at the comma's short pause the voice makes before "um")
    assert cuts["high"] >= 1 and cuts["auto"] == cuts["low"] == 0, cuts
    audio = resample(np.concatenate([silence(0.3), spoken(WHOLE[0], steady=True), silence(1.0)]), PCM16_RATE_HZ,
                     MODEL_RATE_HZ)
    ends = {}
    for eagerness in ("high", "auto", "low"):
        vad = SileroVAD(0.5, 500, 300, turn_end=_semantic(model, eagerness))
        windows = 0
        for start in range(0, len(audio), 640):
            windows += 1
            if any(e.kind == "speech_stopped" for e in vad.feed(audio[start:start + 960])):
                break
        ends[eagerness] = windows * 40  # ms of audio fed when the turn ended
    assert ends["high"] < ends["auto"] < ends["low"], ends  # the same finished question, ended sooner or later


def test_paused_questions_are_one_turn_each_and_answered_whole_in_a_session(default_server: ServerProcess) -> None:
    """Each question streamed at real-time pace with its 0.8 s pause: one user turn, heard whole (the word after
    the pause included: a fitted decode without timestamps dropped it) and answered."""
    heard, answers = [], []
    with session(default_server) as conn:
        updated = conn.update(max_output_tokens=30, audio={"input": {
            "transcription": {"model": "whisper-1"}, "turn_detection": {"type": "semantic_vad"}}})
        assert updated["type"] == "session.updated", updated
        detection = updated["session"]["audio"]["input"]["turn_detection"]
        assert detection["type"] == "semantic_vad" and detection["eagerness"] == "auto", detection
        for head, tail in PAUSED:
            stream(conn, np.concatenate([silence(0.5), clip(head), silence(0.8), clip(tail), silence(2.0)]))
            events, done = conn.until("response.done")
            assert done["response"]["status"] == "completed", (done, of(events, "error"))
            kinds = [e["type"] for e in events]
            assert kinds.count("input_audio_buffer.committed") == 1, kinds
            transcribed = of(events, "conversation.item.input_audio_transcription.completed") or \
                [conn.until("conversation.item.input_audio_transcription.completed")[1]]
            heard.append(transcribed[0]["transcript"])
            answers.append("".join(e.get("delta", "") for e in events if e["type"].endswith("audio_transcript.delta")))
    whole = [words(tail)[-1] in words(text) for (_, tail), text in zip(PAUSED, heard, strict=True)]
    assert all(whole), heard
    # the answers judged together: the 0.5B thinker may miss one
    right = [any(word in words(answer) for word in expected) for expected, answer in zip(RIGHT, answers, strict=True)]
    assert sum(right) >= len(right) - 1, (heard, answers)


def test_bad_semantic_vad_values_are_refused_by_name(default_server: ServerProcess) -> None:
    with session(default_server) as conn:
        refused = conn.update(audio={"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}})
        assert refused["type"] == "error", refused
        assert refused["error"]["param"] == "session.audio.input.turn_detection.eagerness", refused
        fine = conn.update(audio={"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}})
        assert fine["type"] == "session.updated", fine
