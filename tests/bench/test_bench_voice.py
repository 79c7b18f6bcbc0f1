"""``omnipipe bench voice``: its parts on their own (the playback clock's underruns, the real-time pace, the end of
speech of a spoken clip, camera frames beside the audio, the variants, the rows, the server histogram as
``/metrics`` shows it), and the whole bench end to end against a server it starts, one question per mode at c=1."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnipipe.bench.quality import Question
from omnipipe.bench.voice import main, session_questions
from omnipipe.bench.voice_questions import SpokenQuestion, cut_trailing_quiet
from omnipipe.bench.voice_report import HEADERS, server_histogram, server_mean_ms, summarize_turns
from omnipipe.bench.voice_session import CHUNK_BYTES, Listener, Pacer, Turn
from omnipipe.bench.voice_variants import (
    COMMIT,
    SEMANTIC_VAD,
    SERVER_VAD,
    VARIANTS,
    Variant,
    parse_variants,
    session_update,
)
from omnipipe.config.deploy_config import merge_settings
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.util.playback_clock import PlaybackClock
from tests.bench.test_bench_gateway import table_rows

RATE = 24_000
FRANCE = Question("What is the capital of France?", ("paris",))


def pcm(seconds: float, amplitude: float = 0.0) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * 32767 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()


def test_playback_runs_dry_only_when_audio_comes_late() -> None:
    steady = PlaybackClock()
    for i in range(10):  # 0.1 s of audio every 0.1 s: playback never waits
        steady.feed(i * 0.1, 0.1)
    assert steady.underruns == 0
    ahead = PlaybackClock()
    ahead.feed(0.0, 2.0)
    ahead.feed(1.5, 0.1)  # arrives while 0.5 s is still buffered
    assert ahead.underruns == 0
    late = PlaybackClock()
    late.feed(0.0, 0.2)
    late.feed(0.215, 0.2)  # 15 ms dry: under the 20 ms a listener hears
    late.feed(0.5, 0.2)  # 85 ms dry
    late.feed(0.8, 0.2)  # 100 ms dry again
    assert late.underruns == 2


def test_chunks_go_out_at_real_time_pace() -> None:
    sent: list[tuple[float, dict[str, Any]]] = []

    class Socket:
        async def send(self, text: str) -> None:
            sent.append((time.perf_counter(), json.loads(text)))

    async def stream() -> tuple[float, float]:
        pacer = Pacer(Socket())
        start = pacer.origin
        return start, await pacer.stream(pcm(0.2))

    start, last = asyncio.run(stream())
    assert len(sent) == 5 and all(len(base64.b64decode(e["audio"])) == CHUNK_BYTES for _, e in sent)
    assert last - start >= 0.2 - 1e-3  # the last chunk waits until its 40 ms have passed
    assert all(at - start >= 0.04 * (i + 1) - 1e-3 for i, (at, _) in enumerate(sent))


def test_camera_frames_go_out_beside_the_audio_at_their_rate() -> None:
    """A camera variant's pacer sends a frame with its first chunk and then one per 1/fps of the session's time, each
    a JPEG data URL within the worker's limits, capture times growing."""
    from PIL import Image

    from omnipipe.protocol.realtime import MAX_FRAME_BYTES, MIN_FRAME_INTERVAL_MS
    from omnipipe.util.data_url import parse_data_url

    sent: list[dict[str, Any]] = []

    class Socket:
        async def send(self, text: str) -> None:
            sent.append(json.loads(text))

    asyncio.run(Pacer(Socket(), camera_fps=4.0).stream(pcm(1.0)))
    frames = [e for e in sent if e["type"] == "input_video_frame.append"]
    assert len([e for e in sent if e["type"] == "input_audio_buffer.append"]) == 25
    assert 3 <= len(frames) <= 4  # at 0 s, then at most one per 250 ms of the second
    times = [f["captured_at_ms"] for f in frames]
    assert times[0] < 60 and all(b - a >= MIN_FRAME_INTERVAL_MS for a, b in zip(times, times[1:], strict=False))
    media, data = parse_data_url(frames[0]["image"], field="image", kind="image", max_bytes=MAX_FRAME_BYTES)
    assert media == "image/jpeg" and Image.open(io.BytesIO(data)).size == (640, 480)


def test_a_clip_ends_at_its_last_speech_sample() -> None:
    speech, quiet = pcm(0.5, 0.5), pcm(0.7, 0.0)
    assert cut_trailing_quiet(speech + quiet) == speech
    assert cut_trailing_quiet(pcm(0.3) + speech + quiet) == pcm(0.3) + speech  # leading quiet stays
    assert cut_trailing_quiet(quiet) == quiet  # all quiet: nothing to cut to


def test_variants_name_their_settings_and_merge_into_the_session_update() -> None:
    assert [v.name for v in parse_variants("baseline")] == ["baseline"] == [VARIANTS[0].name]
    assert parse_variants("all") == list(VARIANTS)
    with pytest.raises(ValueError, match="--variants: unknown 'nope'"):
        parse_variants("baseline,nope")
    commit = session_update(COMMIT, 30, VARIANTS[0])
    assert commit["type"] == "session.update" and commit["session"]["audio"]["input"]["turn_detection"] is None
    assert commit["session"]["max_output_tokens"] == 30 and commit["session"]["output_modalities"] == ["audio"]
    vad = session_update(SERVER_VAD, 30, VARIANTS[0])["session"]["audio"]["input"]["turn_detection"]
    assert vad == {"type": "server_vad"}  # the server's defaults
    semantic = session_update(SEMANTIC_VAD, 30, VARIANTS[0])["session"]["audio"]["input"]["turn_detection"]
    assert semantic == {"type": "semantic_vad"}  # eagerness auto, the default
    switched = Variant("switched", "a session field on", session={"audio": {"input": {"noise_reduction": "x"}}})
    fields = session_update(SERVER_VAD, 30, switched)["session"]["audio"]["input"]
    assert fields == {"turn_detection": {"type": "server_vad"}, "noise_reduction": "x"}
    base = {"stages": {"thinker": {"options": {"a": 1}}}}
    assert merge_settings(base, {"stages": {"thinker": {"options": {"b": 2}}}}) == \
        {"stages": {"thinker": {"options": {"a": 1, "b": 2}}}}
    assert base == {"stages": {"thinker": {"options": {"a": 1}}}}  # unchanged


def test_each_session_asks_its_own_questions_in_turn() -> None:
    spoken = [SpokenQuestion(Question(str(i), ("x",)), b"") for i in range(5)]
    assert [q.question.text for q in session_questions(spoken, 0, 3)] == ["0", "1", "2"]
    assert [q.question.text for q in session_questions(spoken, 1, 3)] == ["3", "4", "0"]


def turn(speech_end: float, first_audio: float | None, heard: str | None, underruns: int = 0) -> Turn:
    out = Turn(SpokenQuestion(FRANCE, b""), speech_end=speech_end, heard=heard)
    if first_audio is not None:
        out.first_audio, out.done = first_audio, first_audio + 1.0
        out.playback.gaps = [(0.5, 0.05)] * underruns
    else:
        out.error = "no response.done within 1 s"
    return out


def test_a_row_sums_up_the_answered_turns_of_all_sessions() -> None:
    sessions = [[turn(10.0, 10.5, "Paris."), turn(20.0, 21.0, "It is Lyon.", underruns=2)],
                [turn(30.0, 30.3, None), turn(40.0, None, None)]]
    row = summarize_turns("baseline", COMMIT, 2, sessions)
    assert (row["turns"], row["ok"]) == (4, 3)
    assert row["p50_ms"] == pytest.approx(500.0) and row["max_ms"] == pytest.approx(1000.0)
    assert row["session_max_ms"] == [pytest.approx(1000.0), pytest.approx(300.0)]
    assert row["underruns_per_stream"] == pytest.approx(2 / 3)
    assert (row["answers_right"], row["answers_transcribed"]) == (1, 2)
    assert row["errors"] == ["no response.done within 1 s"]


def test_the_listener_gives_the_answer_to_the_turn_being_asked() -> None:
    listener = Listener(None)
    asked = Turn(SpokenQuestion(FRANCE, b""), speech_end=1.0)
    listener.on_event({"type": "response.output_audio.delta", "delta": base64.b64encode(pcm(0.1)).decode()}, 2.0)
    assert not asked.audio  # no turn begun yet
    listener.begin(asked)
    for at in (2.0, 2.05):
        listener.on_event({"type": "response.output_audio.delta",
                           "delta": base64.b64encode(pcm(0.1)).decode()}, at)
    listener.on_event({"type": "response.done", "response": {"status": "completed"}}, 3.0)
    assert asked.ok and asked.latency_s == pytest.approx(1.0) and len(asked.audio) == 2 * len(pcm(0.1))
    assert listener.answered.is_set()
    failed = Turn(SpokenQuestion(FRANCE, b""), speech_end=1.0)
    listener.begin(failed)
    listener.on_event({"type": "error", "error": {"code": "x", "message": "broken"}}, 2.0)
    assert not failed.ok and "broken" in (failed.error or "") and listener.answered.is_set()


def test_a_question_taken_for_two_turns_is_a_cut_turn() -> None:
    """Committed twice, answered before the question ended, or an answer cancelled as the question went on: each
    is a cut (and a failed turn); one commit and an answer after the end of speech is not."""
    listener = Listener(None)
    whole = Turn(SpokenQuestion(FRANCE, b""), speech_end=1.0)
    listener.begin(whole)
    listener.on_event({"type": "input_audio_buffer.committed"}, 1.5)
    listener.on_event({"type": "response.output_audio.delta", "delta": base64.b64encode(pcm(0.1)).decode()}, 2.0)
    listener.on_event({"type": "response.done", "response": {"status": "completed"}}, 3.0)
    whole.check()
    assert whole.ok and not whole.cut and whole.commits == 1
    talked_over = Turn(SpokenQuestion(FRANCE, b""), speech_end=3.0)
    listener.begin(talked_over)
    listener.on_event({"type": "input_audio_buffer.committed"}, 1.0)  # at the pause
    listener.on_event({"type": "response.done", "response": {"status": "cancelled", "status_details": {
        "type": "cancelled", "reason": "turn_detected"}}}, 2.0)
    listener.on_event({"type": "input_audio_buffer.committed"}, 3.5)  # the rest, after the answer's end
    talked_over.check()
    assert talked_over.cut and talked_over.commits == 2 and "cut" in (talked_over.error or "")
    early = Turn(SpokenQuestion(FRANCE, b""), speech_end=3.0)
    listener.begin(early)
    listener.on_event({"type": "response.output_audio.delta", "delta": base64.b64encode(pcm(0.1)).decode()}, 2.0)
    listener.on_event({"type": "response.done", "response": {"status": "completed"}}, 2.5)
    early.check()
    assert early.cut and not early.ok and "before the end of speech" in (early.error or "")
    row = summarize_turns("baseline", SEMANTIC_VAD, 1, [[whole, talked_over, early]])
    assert (row["ok"], row["cut"]) == (1, 2)


def test_the_turn_histogram_is_in_the_metrics_text() -> None:
    metrics = ServerMetrics("default", {})
    before = server_histogram(metrics.render({}).decode())
    metrics.observe_speech_end_to_first_audio(0.4, "commit")
    metrics.observe_speech_end_to_first_audio(0.6, "commit")
    metrics.observe_speech_end_to_first_audio(1.2, "server_vad")
    text = metrics.render({}).decode()
    assert "omnipipe:realtime_speech_end_to_first_audio_seconds_bucket{" in text
    after = server_histogram(text)
    assert server_mean_ms(before, after, "commit") == (2, pytest.approx(500.0))
    assert server_mean_ms(before, after, "server_vad") == (1, pytest.approx(1200.0))


def test_bad_arguments_are_usage_errors() -> None:
    for args in (["--modes", "push"], ["--concurrency", "0"], ["--concurrency", "a"], ["--variants", "nope"],
                 ["--questions", "0"], ["--pause-s", "-1"], ["--pause-s", "9"], ["--question-set", "nope"],
                 ["--question-set", "quality", "--pause-s", "0.8"]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 2, args


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.timeout(900)
def test_the_bench_times_a_spoken_turn_in_every_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A started default-pipeline server, one question per mode (commit, server VAD, semantic VAD) at c=1: every
    turn answered and none cut, its gap timed by the client and by the server's histogram, the answer transcribed
    and right, and the table printed."""
    path = tmp_path / "voice.json"
    code = main(["--concurrency", "1", "--questions", "1", "--max-tokens", "24", "--spoken-cache-dir",
                 str(tmp_path / "spoken"), "--json", str(path)])
    printed = capsys.readouterr().out
    rows = json.loads(path.read_text())["rows"]
    assert code == 0, printed
    assert [(r["mode"], r["concurrency"]) for r in rows] == [(COMMIT, 1), (SERVER_VAD, 1), (SEMANTIC_VAD, 1)]
    for row in rows:
        assert row["ok"] == row["turns"] == 1, row["errors"]
        assert 0 < row["p50_ms"] == row["max_ms"] < 60_000, row
        assert row["server_turns"] == 1 and 0 < row["server_mean_ms"] < 60_000, row  # the server's histogram
        assert row["underruns_per_stream"] is not None
        assert row["answers_transcribed"] == 1 and row["answers_right"] == 1, row["turn_detail"]
    assert len(table_rows(printed, HEADERS)) == 3, printed
    assert all(row["cut"] == 0 for row in rows)
