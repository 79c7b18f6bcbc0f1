"""Live camera frames in a realtime session (an omnipipe extension): ``input_video_frame.append`` with a PNG or
JPEG data URL and the frame's capture time (``captured_at_ms``, the client's clock).

The session keeps the frames appended since its last user item: at most ``MAX_FRAME_BYTES`` each, captured at
least ``MIN_FRAME_INTERVAL_MS`` apart, and only the last ``BUFFER_MS`` / ``MAX_BUFFERED_FRAMES`` of them (older
ones are dropped), so a long session holds a bounded amount. While the session is paused, frames are dropped
unread; ``input_audio_buffer.clear`` drops them too.

The next user item (a committed audio buffer or a created user message) takes them: sampled at the model's rate,
walking back from the newest frame (one is kept when it was captured at least three quarters of a ``1/fps``
interval before the last one kept), the most recent ones up to the model's cap. A family that takes video gets
them as one video at the rate and cap of its ``ServingTraits.video_stage`` options ``video_fps`` and
``video_max_frames`` (the rate the thinker takes frames to have); frames of another size than the newest, where the
camera changed, are left out. A family that takes images gets them as images (1 per second, up to
``ServingTraits.max_images`` with the item's own images). A turn the server VAD ends after an answer started
tentatively at its pause (``speculative_start.py``) takes the frames captured by the pause, as the tentative answer
did (so it can be adopted); later ones wait for the next user item.
"""

from __future__ import annotations

import io
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.realtime import MAX_FRAME_BYTES, MIN_FRAME_INTERVAL_MS, InputVideoFrameAppend
from omnipipe.server.routes.realtime.checks import check_image_url
from omnipipe.server.routes.realtime.events import EventError
from omnipipe.stage.checkpoint_options import MultimodalThinkerOptions

if TYPE_CHECKING:
    from omnipipe.api.async_omni import AsyncOmni
    from omnipipe.server.routes.realtime.pause import SessionPause

MAX_FRAME_SIDE = 2048  # pixels, either side
BUFFER_MS = 20_000.0  # frames kept, back from the newest
MAX_BUFFERED_FRAMES = 64
IMAGE_FRAMES_FPS = 1.0  # the rate of frames given as images
_FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG"}


@dataclass(frozen=True)
class Frame:
    url: str  # a checked PNG or JPEG data URL
    captured_at_ms: float
    size: tuple[int, int] = (0, 0)  # width, height


def sample_frames(frames: list[Frame], fps: float, most: int) -> list[Frame]:
    """``frames`` (by capture time) at about ``fps``: walking back from the newest, a frame is kept when it was
    captured at least 3/4 of a ``1/fps`` interval before the last one kept; at most ``most`` (the newest), in
    capture order."""
    if most <= 0:
        return []
    gap = 0.75 * 1000.0 / fps
    kept: list[Frame] = []
    for frame in reversed(frames):
        if not kept or kept[-1].captured_at_ms - frame.captured_at_ms >= gap:
            kept.append(frame)
            if len(kept) == most:
                break
    return kept[::-1]


def frames_media(pipeline: PipelineSpec, deploy: Any, frames: list[Frame]) -> dict[str, Any]:
    """A turn's frames as the prompt's ``multi_modal_data``: ``{"video": [images]}`` (one video; frames of another
    size than the newest, where the camera changed, left out; each image opened, decoded by the prompt processor off
    the event loop) or ``{"image": [data URLs]}``."""
    from PIL import Image

    from omnipipe.util.data_url import parse_data_url

    if frame_plan(pipeline, deploy)[0] == "image":
        return {"image": [frame.url for frame in frames]}
    size = frames[-1].size
    return {"video": [Image.open(io.BytesIO(parse_data_url(frame.url, field="image")[1]))
                      for frame in frames if frame.size == size]}


def frame_plan(pipeline: PipelineSpec, deploy: Any) -> tuple[str, float, int]:
    """How a pipeline takes a turn's frames: ``("video", fps, most)``, ``("image", fps, most)``; ``deploy``: the
    engine's deploy (the video stage's options)."""
    traits = pipeline.serving
    if "video" in pipeline.input_modalities and traits.video_stage is not None:
        options = dict(deploy.stages[traits.video_stage].options) if deploy is not None else {}
        fps = float(options.get("video_fps", MultimodalThinkerOptions.video_fps))
        return "video", fps, int(options.get("video_max_frames", MultimodalThinkerOptions.video_max_frames))
    return "image", IMAGE_FRAMES_FPS, traits.max_images or 1


class CameraFrames:
    """The frames appended since the session's last user item. ``pipeline`` and ``engine``: the session's (how its
    model takes frames, the video stage's options in the engine's deploy); ``pause``: the session's pause (a paused
    session drops frames unread)."""

    def __init__(self, pipeline: PipelineSpec, engine: AsyncOmni, pause: SessionPause) -> None:
        self.pipeline = pipeline
        self.engine = engine
        self.pause = pause
        self.frames: deque[Frame] = deque()
        self._last_ms: float | None = None  # the capture time of the last frame accepted in the session

    async def append(self, event: InputVideoFrameAppend) -> None:
        if self.pause.paused:
            return  # dropped unread
        pipeline = self.pipeline
        if not {"image", "video"} & set(pipeline.input_modalities):
            raise EventError(f"image: pipeline {pipeline.name!r} takes no images or video (it takes "
                             f"{', '.join(pipeline.input_modalities)})", "image", code="unsupported_modality")
        self._check_time(event.captured_at_ms)
        size = _check_frame(event.image)  # not activity for the idle timeout: a camera left on is not a user
        self._last_ms = event.captured_at_ms
        self.frames.append(Frame(event.image, event.captured_at_ms, size))
        while len(self.frames) > MAX_BUFFERED_FRAMES or \
                self.frames[0].captured_at_ms < event.captured_at_ms - BUFFER_MS:
            self.frames.popleft()

    def _check_time(self, at_ms: float) -> None:
        last = self._last_ms
        if last is None:
            return
        if at_ms < last:
            raise EventError(f"captured_at_ms: {at_ms:g} is before the previous frame's {last:g}; capture times "
                             "must not go back", "captured_at_ms")
        if at_ms - last < MIN_FRAME_INTERVAL_MS:
            raise EventError(f"captured_at_ms: frames come at most {1000 / MIN_FRAME_INTERVAL_MS:g} a second; this one "
                             f"was captured {at_ms - last:g} ms after the previous one", "captured_at_ms",
                             code="frame_rate_exceeded")

    def newest_ms(self) -> float:
        """The capture time of the newest frame kept (-inf when none)."""
        return self.frames[-1].captured_at_ms if self.frames else float("-inf")

    def peek(self, images_already: int = 0, until_ms: float | None = None) -> list[Frame]:
        """The frames a user item made now would take (sampled for the model; ``images_already``: the item's own
        images, which count against an image family's cap; ``until_ms``: only those captured by then)."""
        frames = [f for f in self.frames if until_ms is None or f.captured_at_ms <= until_ms]
        if not frames:
            return []
        kind, fps, most = frame_plan(self.pipeline, self.engine.deploy)
        return sample_frames(frames, fps, most - images_already if kind == "image" else most)

    def take(self, images_already: int = 0, until_ms: float | None = None) -> list[Frame]:
        """``peek``, and the frames it looked at leave the buffer (later ones wait for the next user item)."""
        frames = self.peek(images_already, until_ms)
        self.frames = deque(f for f in self.frames if until_ms is not None and f.captured_at_ms > until_ms)
        return frames

    def clear(self) -> None:
        self.frames.clear()


def _check_frame(url: str) -> tuple[int, int]:
    """A frame's data URL: PNG or JPEG (the header says it, the bytes agree), at most ``MAX_FRAME_BYTES`` and
    ``MAX_FRAME_SIDE`` pixels a side; its size."""
    from PIL import Image, UnidentifiedImageError

    media_type, raw = check_image_url(url, "image", MAX_FRAME_BYTES)
    try:
        with Image.open(io.BytesIO(raw)) as image:
            found, size = image.format, image.size
    except (UnidentifiedImageError, OSError):
        raise EventError("image: the data is not a PNG or JPEG image", "image", code="invalid_image") from None
    if found != _FORMATS[media_type]:
        raise EventError(f"image: the data URL says {media_type} but the data is {found}", "image",
                         code="invalid_image")
    if max(size) > MAX_FRAME_SIDE:
        raise EventError(f"image: {size[0]}x{size[1]} pixels; a frame is at most {MAX_FRAME_SIDE} a side", "image",
                         code="image_too_large")
    return size
