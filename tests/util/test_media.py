"""util/media.py on real files: WAV through soundfile, MP4 through PyAV, PNG through Pillow, data URLs, and the
bad inputs each refuses with the field named."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

from omnipipe.util.field_error import FieldError
from omnipipe.util.media import (
    MAX_IMAGE_PIXELS,
    encoded_file,
    load_audio,
    load_image,
    load_video,
    nearest_frames,
    spread,
)

VIDEO_FPS = 10
VIDEO_SECONDS = 3
STEP = 8  # colour levels between consecutive frames


def frame_colour(index: int) -> tuple[int, int, int]:
    return (index * STEP, 255 - index * STEP, 96)


def index_of(frame: np.ndarray) -> int:
    """The frame index a decoded frame's colour encodes (lossy coding moves a level by a few units at most)."""
    red, green, _ = frame.reshape(-1, 3).mean(axis=0)
    by_red, by_green = round(red / STEP), round((255 - green) / STEP)
    assert by_red == by_green, (red, green)
    return by_red


def encode_video(path: Path | None = None, codec: str = "libx264", size: tuple[int, int] = (64, 48)) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(str(path) if path else buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=VIDEO_FPS)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000  # flat colours stay within a level of what was drawn
        for index in range(VIDEO_FPS * VIDEO_SECONDS):
            image = np.empty((size[1], size[0], 3), dtype=np.uint8)
            image[:] = frame_colour(index)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path.read_bytes() if path else buffer.getvalue()


@pytest.fixture(scope="module")
def mp4() -> bytes:
    return encode_video()


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def data_url(mime: str, raw: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


# ---------------------------------------------------------------------------------------------- images
def test_png_bytes_path_data_url_and_arrays_give_the_same_rgb_image(tmp_path: Path) -> None:
    array = np.zeros((5, 7, 3), dtype=np.uint8)
    array[:, :, 0] = np.arange(7) * 30
    array[2, 3] = (1, 2, 3)
    raw = png_bytes(array)
    (tmp_path / "a.png").write_bytes(raw)
    for value in (raw, bytearray(raw), data_url("image/png", raw), str(tmp_path / "a.png"), tmp_path / "a.png",
                  array):
        image = load_image(value, "x")
        assert image.mode == "RGB" and image.size == (7, 5)
        assert np.array_equal(np.asarray(image), array)


def test_grey_and_rgba_images_become_rgb() -> None:
    from PIL import Image

    grey = np.full((3, 4), 200, dtype=np.uint8)
    assert np.array_equal(np.asarray(load_image(grey, "x")), np.full((3, 4, 3), 200, dtype=np.uint8))
    rgba = Image.new("RGBA", (2, 2), (10, 20, 30, 40))
    assert np.asarray(load_image(rgba, "x"))[0, 0].tolist() == [10, 20, 30]


@pytest.mark.parametrize("value, rule", [
    (b"", "empty"),
    (b"GIF89a but not really an image", "not an image"),
    ("data:image/png;base64,%%%", "not valid base64"),
    ("data:audio/wav;base64,AAAA", "data:image/"),
    ("https://example.com/cat.png", "remote URLs are not fetched"),
    ("/no/such/file.png", "file not found"),
    (np.zeros((4, 4, 3), dtype=np.float32), "uint8"),
    (np.zeros((4, 4, 2), dtype=np.uint8), "H x W"),
    (12, "expected"),
])
def test_bad_images_are_refused_naming_the_field(value: object, rule: str) -> None:
    with pytest.raises(FieldError) as caught:
        load_image(value, "prompt.multi_modal_data.image[1]")
    assert caught.value.field == "prompt.multi_modal_data.image[1]"
    assert rule in caught.value.rule


def test_an_image_too_large_is_refused_from_its_header() -> None:
    from PIL import Image

    side = int(MAX_IMAGE_PIXELS ** 0.5) + 1
    buffer = io.BytesIO()
    Image.new("L", (side, side)).save(buffer, format="PNG")
    with pytest.raises(FieldError, match="pixels") as caught:
        load_image(buffer.getvalue(), "img")
    assert caught.value.field == "img"


# ---------------------------------------------------------------------------------------------- audio
def test_wav_file_bytes_and_data_url_are_resampled_to_16k(tmp_path: Path) -> None:
    import soundfile

    samples = tone(0.5, 24_000)
    soundfile.write(tmp_path / "a.wav", samples, 24_000, subtype="FLOAT")
    raw = (tmp_path / "a.wav").read_bytes()
    expected = tone(0.5, 16_000)
    for value in (tmp_path / "a.wav", str(tmp_path / "a.wav"), raw, data_url("audio/wav", raw)):
        audio = load_audio(value, "x")
        assert audio.dtype == np.float32 and audio.shape == (8000,)
        # the resampled tone matches the tone drawn at 16 kHz, away from the edges
        assert np.max(np.abs(audio[200:-200] - expected[200:-200])) < 0.01


def test_stereo_flac_is_averaged_to_mono(tmp_path: Path) -> None:
    import soundfile

    left, right = tone(0.25, 16_000), np.zeros(4000, dtype=np.float32)
    soundfile.write(tmp_path / "s.flac", np.stack([left, right], axis=1), 16_000)
    audio = load_audio(tmp_path / "s.flac", "x")
    assert np.max(np.abs(audio - left / 2)) < 1e-3


def test_arrays_and_sample_rate_tuples() -> None:
    at_16k = tone(0.1, 16_000)
    assert np.array_equal(load_audio(at_16k, "x"), at_16k)
    resampled = load_audio((tone(0.1, 8_000), 8_000), "x")
    assert resampled.shape == (1600,)
    assert np.max(np.abs(resampled[100:-100] - at_16k[100:-100])) < 0.01
    assert load_audio((tone(0.1, 16_000), 16_000), "x", sample_rate=24_000).shape == (2400,)


@pytest.mark.parametrize("value, rule", [
    (b"", "empty"),
    (b"RIFF not really a wave file at all", "not audio"),
    ("data:audio/wav;base64,!!", "not valid base64"),
    ("data:image/png;base64,AAAA", "data:audio/"),
    ("http://example.com/a.wav", "remote URLs are not fetched"),
    ((np.zeros(10, dtype=np.float32), 0), "positive integer"),
    ((np.zeros(10, dtype=np.float32),), "(samples, sample_rate_hz)"),
    (([0.0, 0.1], 16000), "numpy array"),
    (np.zeros(0, dtype=np.float32), "empty"),
    (np.array([0.0, np.nan], dtype=np.float32), "NaN"),
    ({"data": "x"}, "expected"),
])
def test_bad_audio_is_refused_naming_the_field(value: object, rule: str) -> None:
    with pytest.raises(FieldError) as caught:
        load_audio(value, "prompt.multi_modal_data.audio")
    assert caught.value.field == "prompt.multi_modal_data.audio"
    assert rule in caught.value.rule


def test_audio_longer_than_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import omnipipe.util.media as media

    monkeypatch.setattr(media, "MAX_AUDIO_SECONDS", 1.0)
    with pytest.raises(FieldError, match="longer than 1 s"):
        load_audio(tone(1.5, 16_000), "a")


# ---------------------------------------------------------------------------------------------- video
def test_mp4_sampled_at_2_fps_takes_the_frame_at_each_half_second(mp4: bytes) -> None:
    frames = load_video(mp4, "v", fps=2.0)
    assert frames.dtype == np.uint8 and frames.shape == (6, 48, 64, 3)
    assert [index_of(f) for f in frames] == [0, 5, 10, 15, 20, 25]


def test_sampling_between_frames_takes_the_nearest(mp4: bytes) -> None:
    # instants k/3 s against frames every 0.1 s: 0.333 -> frame 3, 0.667 -> frame 7, ...
    frames = load_video(mp4, "v", fps=3.0)
    assert [index_of(f) for f in frames] == [0, 3, 7, 10, 13, 17, 20, 23, 27]


def test_max_frames_keeps_an_even_spread(mp4: bytes) -> None:
    frames = load_video(mp4, "v", fps=10.0, max_frames=4)
    assert [index_of(f) for f in frames] == [0, 10, 19, 29]


def test_video_from_path_data_url_and_other_codec(tmp_path: Path, mp4: bytes) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(mp4)
    for value in (path, str(path), data_url("video/mp4", mp4)):
        assert [index_of(f) for f in load_video(value, "v", fps=1.0)] == [0, 10, 20]
    other = encode_video(tmp_path / "m.mp4", codec="mpeg4")
    assert [index_of(f) for f in load_video(other, "v", fps=1.0)] == [0, 10, 20]


def test_encoded_file_reads_bytes_paths_and_data_urls_but_not_frames(tmp_path: Path, mp4: bytes) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(mp4)
    for value in (mp4, path, str(path), data_url("video/mp4", mp4)):
        assert encoded_file(value, "video", "v") == mp4
    assert encoded_file(np.zeros((2, 4, 4, 3), np.uint8), "video", "v") is None
    assert encoded_file([b"frame"], "video", "v") is None
    with pytest.raises(FieldError, match="file not found") as caught:
        encoded_file(str(tmp_path / "missing.mp4"), "video", "prompt.video")
    assert caught.value.field == "prompt.video"


def test_frames_given_as_images_or_an_array() -> None:
    images = [np.full((4, 6, 3), frame_colour(i), dtype=np.uint8) for i in range(5)]
    listed = load_video([png_bytes(images[0]), *images[1:]], "v")
    assert listed.shape == (5, 4, 6, 3) and [index_of(f) for f in listed] == [0, 1, 2, 3, 4]
    capped = load_video(np.stack(images), "v", max_frames=3)
    assert [index_of(f) for f in capped] == [0, 2, 4]
    # of a list, only the frames kept are decoded: a bad frame between them is never looked at
    skipping = load_video([images[0], b"not an image", images[2], b"nor this", images[4]], "v", max_frames=3)
    assert [index_of(f) for f in skipping] == [0, 2, 4]


@pytest.mark.parametrize("value, field, rule", [
    (b"", "v", "empty"),
    (b"\x00\x00\x00\x18ftypmp42 and then nothing useful", "v", "not a video"),
    ("data:video/mp4;base64,@@", "v", "not valid base64"),
    ("data:image/png;base64,AAAA", "v", "data:video/"),
    ("https://example.com/v.mp4", "v", "remote URLs are not fetched"),
    ([], "v", "no frames"),
    ([np.zeros((4, 4, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)], "v[1]", "size of the first"),
    ([np.zeros((4, 4, 3), np.uint8), "not an image"], "v[1]", "file not found"),
    (np.zeros((2, 4, 4), np.uint8), "v", "[T, H, W, 3]"),
    (np.zeros((0, 4, 4, 3), np.uint8), "v", "no frames"),
    (3.5, "v", "expected"),
])
def test_bad_video_is_refused_naming_the_field(value: object, field: str, rule: str) -> None:
    with pytest.raises(FieldError) as caught:
        load_video(value, "v")
    assert caught.value.field == field
    assert rule in caught.value.rule


def test_a_file_with_only_audio_has_no_video_stream(tmp_path: Path) -> None:
    import soundfile

    soundfile.write(tmp_path / "a.wav", tone(0.1, 16_000), 16_000)
    with pytest.raises(FieldError, match="no video stream"):
        load_video((tmp_path / "a.wav").read_bytes(), "v")


def test_a_truncated_mp4_is_refused(mp4: bytes) -> None:
    with pytest.raises(FieldError) as caught:
        load_video(mp4[: len(mp4) // 3], "v")
    assert caught.value.field == "v"


@pytest.mark.parametrize("fps, max_frames, field", [(0, 4, "fps"), (float("nan"), 4, "fps"), (1000.0, 4, "fps"),
                                                    (2.0, 0, "max_frames"), (2.0, 2.5, "max_frames")])
def test_bad_sampling_arguments(fps: float, max_frames: int, field: str) -> None:
    with pytest.raises(FieldError) as caught:
        load_video(np.zeros((1, 2, 2, 3), np.uint8), "v", fps=fps, max_frames=max_frames)
    assert caught.value.field == field


def test_nearest_frames_and_spread() -> None:
    assert nearest_frames([0.0, 0.4, 0.55, 1.7], fps=2.0) == [0, 2, 2, 3]  # instants 0, 0.5, 1.0, 1.5
    assert nearest_frames([0.0, 0.4, 0.6], fps=2.0) == [0, 1]  # 0.5 is as near 0.4 as 0.6: the earlier
    assert nearest_frames([0.0], fps=2.0) == [0]
    assert nearest_frames([], fps=2.0) == []
    assert spread(3, 5) == [0, 1, 2]
    assert spread(10, 1) == [0]
    assert spread(11, 3) == [0, 5, 10]
