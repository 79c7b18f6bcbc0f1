"""Live camera frames in realtime sessions (``input_video_frame.append``, an omnipipe extension): the frames of a
turn go to the model with its words (as images for the default family, whose thinker reads each image's main
colour), sampled at 1 per second and capped, listed in the user item by capture time; a bad frame, one too fast,
one for a model that takes no images, is an ``error`` naming the field and the session goes on; a paused session
drops them; the buffer never holds more than its bound."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image

from omnipipe.server.routes.realtime.frames import (
    BUFFER_MS,
    MAX_BUFFERED_FRAMES,
    MAX_FRAME_BYTES,
    MIN_FRAME_INTERVAL_MS,
    CameraFrames,
    Frame,
    frame_plan,
    frames_media,
    sample_frames,
)
from tests.server.conftest import ServerProcess, engines_idle, spoken
from tests.server.test_realtime import RATE, Conn, of, session


def frame_url(colour: tuple[int, int, int], kind: str = "JPEG", size: tuple[int, int] = (160, 120)) -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), colour, np.uint8)).save(buffer, kind)
    media = "jpeg" if kind == "JPEG" else kind.lower()
    return f"data:image/{media};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def send_frame(conn: Conn, url: str, at_ms: float) -> None:
    conn.send("input_video_frame.append", image=url, captured_at_ms=at_ms)


def still_works(conn: Conn) -> None:
    conn.send("conversation.item.retrieve", item_id="none")
    assert conn.until("error")[1]["error"]["param"] == "item_id"


def frame_times(item: dict[str, Any]) -> list[float]:
    return [part["captured_at_ms"] for part in item["content"] if "captured_at_ms" in part]


# ------------------------------------------------------------------------------------------------ sampling
def _frames(times: list[float]) -> list[Frame]:
    return [Frame(f"f{t}", t) for t in times]


@pytest.mark.parametrize(("times", "fps", "most", "kept"), [
    ([0, 500, 1000, 1500, 2000], 2.0, 64, [0, 500, 1000, 1500, 2000]),  # at the rate: all
    ([0, 250, 500, 750, 1000], 2.0, 64, [0, 500, 1000]),  # twice the rate: every other, back from the newest
    ([0, 480, 1010, 1490, 2000], 2.0, 64, [0, 480, 1010, 1490, 2000]),  # jitter keeps them
    ([0, 500, 1000, 1500, 2000], 1.0, 2, [1000, 2000]),  # the newest, capped
    ([100], 1.0, 4, [100]),
    ([0, 300], 1.0, 0, []),
])
def test_frames_are_sampled_back_from_the_newest(times, fps, most, kept) -> None:
    assert [f.captured_at_ms for f in sample_frames(_frames(times), fps, most)] == kept


def test_the_buffer_keeps_the_last_frames_only() -> None:
    """Appends spaced at the limit for twice the buffer's span: the buffer holds the last BUFFER_MS or
    MAX_BUFFERED_FRAMES of them, never more."""
    from omnipipe.models.default.pipeline import DEFAULT
    from omnipipe.protocol.realtime import InputVideoFrameAppend

    engine, pause = SimpleNamespace(deploy=None), SimpleNamespace(paused=False)
    frames = CameraFrames(DEFAULT, engine, pause)  # type: ignore[arg-type]
    url = frame_url((0, 200, 0))
    held = []
    count = int(2 * BUFFER_MS / MIN_FRAME_INTERVAL_MS)
    for i in range(count):
        asyncio.run(frames.append(InputVideoFrameAppend(type="input_video_frame.append", image=url,
                                                        captured_at_ms=i * MIN_FRAME_INTERVAL_MS)))
        held.append(len(frames.frames))
    assert max(held) == min(MAX_BUFFERED_FRAMES, int(BUFFER_MS / MIN_FRAME_INTERVAL_MS) + 1)
    assert frames.frames[-1].captured_at_ms == (count - 1) * MIN_FRAME_INTERVAL_MS
    taken = frames.take()
    assert [f.captured_at_ms for f in taken] == [(count - 1 - 3 * k) * MIN_FRAME_INTERVAL_MS for k in (3, 2, 1, 0)]
    assert not frames.frames  # the item took them


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
def test_a_video_family_gets_the_frames_as_one_video_of_their_pixels(family: str) -> None:
    """The prompt processor of each family that takes video reads a turn's frames as one [T, H, W, 3] video, the
    very pixels PIL decodes from them; a frame of another size than the newest (the camera changed) is left out;
    the rate and cap come from the deploy's thinker options."""
    import importlib

    from omnipipe.config.deploy_config import load_deploy

    pipeline = importlib.import_module(f"omnipipe.models.{family}.pipeline").PIPELINE
    processors = importlib.import_module(f"omnipipe.models.{family}.processors")
    process = processors.omni_prompt if family == "qwen2_5_omni" else processors.prompt
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    frames = [Frame(frame_url((9, 9, 9), size=(64, 48)), 0.0, (64, 48))]
    frames += [Frame(frame_url(colour, "PNG"), 300.0 * (i + 1), (160, 120)) for i, colour in enumerate(colours)]
    media = frames_media(pipeline, None, frames)
    video = process({"prompt": "what changes?", "multi_modal_data": media}).data["videos"][0]
    assert video.shape == (3, 120, 160, 3)
    assert [tuple(int(c) for c in frame[60, 80]) for frame in video] == colours
    deploy = load_deploy({"stages": {"thinker": {"options": {"model": "/nowhere", "video_fps": 4.0,
                                                             "video_max_frames": 6}}}}, pipeline)
    assert frame_plan(pipeline, deploy) == ("video", 4.0, 6)
    assert frame_plan(pipeline, None) == ("video", 2.0, 64)


def test_an_image_family_gets_the_frames_as_images() -> None:
    from omnipipe.models.default.pipeline import DEFAULT

    frames = [Frame(frame_url((200, 30, 30)), 0.0, (160, 120))]
    assert frames_media(DEFAULT, None, frames) == {"image": [frames[0].url]}
    assert frame_plan(DEFAULT, None) == ("image", 1.0, 4)


# ------------------------------------------------------------------------------------------------ refusals
def test_a_frame_for_a_model_that_takes_no_images_is_refused_by_name(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        send_frame(conn, frame_url((255, 0, 0)), 0)
        error = conn.until("error")[1]["error"]
        assert error["param"] == "image" and error["code"] == "unsupported_modality", error
        assert "takes no images or video" in error["message"]
        still_works(conn)


@pytest.mark.models
def test_bad_frames_get_errors_naming_the_field(default_server: ServerProcess) -> None:
    red = frame_url((220, 20, 20))
    text_as_jpeg = "data:image/jpeg;base64," + base64.b64encode(b"this is not a picture").decode()
    gif = "data:image/gif;base64," + base64.b64encode(b"GIF89a" + bytes(20)).decode()
    too_big = "data:image/jpeg;base64," + "A" * (MAX_FRAME_BYTES * 4 // 3 + 8)
    cases = [  # (image, captured_at_ms, param, code, words in the message)
        (gif, 0, "image", "invalid_image", "image/gif"),
        ("data:text/plain;base64,aGVsbG8=", 0, "image", "invalid_image", "data URL"),
        (text_as_jpeg, 0, "image", "invalid_image", "not a PNG or JPEG"),
        (frame_url((220, 20, 20), "PNG").replace("image/png", "image/jpeg"), 0, "image", "invalid_image", "is PNG"),
        ("data:image/jpeg;base64,***", 0, "image", "invalid_image", "base64"),
        (too_big, 0, "image", "image_too_large", "larger than"),
        (frame_url((220, 20, 20), size=(2100, 16)), 0, "image", "image_too_large", "2100x16"),
        (red, -1, "captured_at_ms", "invalid_value", None),
        (red, 1000, None, None, None),  # accepted
        (red, 1100, "captured_at_ms", "frame_rate_exceeded", "100 ms after"),
        (red, 900, "captured_at_ms", "invalid_value", "go back"),
    ]
    with session(default_server) as conn:
        conn.no_vad(output_modalities=["text"])
        for image, at_ms, param, code, words in cases:
            send_frame(conn, image, at_ms)
            if param is None:
                continue
            error = conn.until("error")[1]["error"]
            assert (error["param"], error["code"]) == (param, code), (image[:40], at_ms, error)
            assert words is None or words in error["message"], error
        conn.send("input_video_frame.append", captured_at_ms=2000)
        assert conn.until("error")[1]["error"]["param"] == "image"  # missing
        still_works(conn)
        added = conn.user_text("What colour do you see? One word.")
        assert frame_times(added["item"]) == [1000], added  # the one frame taken; nothing refused joined


# ------------------------------------------------------------------------------------------------ the answer
def _answer(conn: Conn) -> str:
    conn.send("response.create")
    events, done = conn.until("response.done")
    assert done["response"]["status"] == "completed", (done, of(events, "error"))
    return "".join(d["delta"] for d in of(events, "response.output_text.delta")).lower()


@pytest.mark.models
def test_the_answer_sees_the_frames_of_its_turn(default_server: ServerProcess) -> None:
    """Red frames for a typed question, then blue ones: each answer names its turn's colour; the item lists the
    frames it took (1 per second, the last 4); a paused session drops the frames sent meanwhile."""
    with session(default_server) as conn:
        conn.no_vad(output_modalities=["text"], max_output_tokens=20)
        clock = 0.0
        for colour, name in (((220, 20, 20), "red"), ((20, 40, 220), "blue")):
            sent = []
            for _ in range(12):  # 6 s at 2 frames a second
                clock += 500
                send_frame(conn, frame_url(colour), clock)
                sent.append(clock)
            added = conn.user_text("What colour do you see? Answer with one word.")
            assert frame_times(added["item"]) == sent[-7::2], added
            assert name in _answer(conn)
        conn.send("session.pause")
        conn.until("session.paused")
        send_frame(conn, frame_url((20, 200, 20)), clock + 500)
        conn.send("session.resume")
        conn.until("session.resumed")
        assert frame_times(conn.user_text("And now?")["item"]) == []
    assert engines_idle(default_server.wait_idle(timeout_s=60))


@pytest.mark.models
def test_a_spoken_question_takes_the_frames_seen_while_speaking(default_server: ServerProcess) -> None:
    """The camera's frames ride beside the microphone's audio; a spoken question committed by the client is
    answered about them."""
    question = spoken("What colour do you see?", steady=True)
    with session(default_server) as conn:
        conn.no_vad(output_modalities=["text"], max_output_tokens=20)
        step = 2400  # 100 ms appends
        for i, start in enumerate(range(0, len(question), step)):
            conn.send("input_audio_buffer.append", audio=_pcm16(question[start:start + step]))
            if i % 5 == 0:  # 2 frames a second
                send_frame(conn, frame_url((20, 160, 40)), i * 100.0)
        conn.send("input_audio_buffer.commit")
        events, added = conn.until("conversation.item.added")
        assert frame_times(added["item"]), added
        assert "green" in _answer(conn)


@pytest.mark.models  # the default server, as its neighbours: out of make test-fast
def test_under_server_vad_the_turn_takes_the_frames_kept_at_its_pause(default_server: ServerProcess) -> None:
    """Frames at 4 a second, also through the silence that ends the turn: the answer started tentatively at the
    pause (with the frames kept by then) is the one released, and the item took exactly those frames; the frames
    after the pause wait for the next user item."""
    from tests.server.test_realtime_voice_turn import CHUNK, clip, counters, grew

    question = clip("What colour do you see?")
    audio = np.concatenate([np.zeros(RATE // 2, np.float32), question, np.zeros(RATE * 3 // 2, np.float32)])
    speech_end_ms = (RATE // 2 + len(question)) * 1000 / RATE
    before = counters(default_server)
    with session(default_server) as conn:
        conn.update(output_modalities=["text"], max_output_tokens=20, audio={"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}})
        start = time.perf_counter()
        sent = []
        for i, offset in enumerate(range(0, len(audio), CHUNK)):  # real-time pace, 40 ms appends
            delay = start + i * CHUNK / RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            conn.send("input_audio_buffer.append", audio=_pcm16(audio[offset:offset + CHUNK]))
            if i % 7 == 0:  # 280 ms apart, on the audio's clock
                sent.append(offset * 1000 / RATE)
                send_frame(conn, frame_url((20, 160, 40)), sent[-1])
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        took = frame_times(of(events, "conversation.item.added")[0]["item"])
        later = conn.user_text("And now?")
    assert took and max(took) < speech_end_ms + 500 < max(sent), (took, speech_end_ms, sent)
    assert frame_times(later["item"]) and min(frame_times(later["item"])) > max(took)
    assert grew(before, counters(default_server), 'speculative_starts{model_name="default",outcome="released"}') == 1
    assert "green" in "".join(d["delta"] for d in of(events, "response.output_text.delta")).lower()


def _pcm16(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()
