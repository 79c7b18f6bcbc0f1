"""``ChatTap``: a ``/v1/chat/completions`` exchange recorded as one turn.

The request's envelope (model, stream, modalities, audio options) is recorded as it came, since the worker may
refuse it and the recording still shows what was asked. Each media part's object and each drawn image is read with
its ``protocol.openai`` model; one that does not fit is left out (logged), the rest of the turn is kept.
"""

from __future__ import annotations

import json
from typing import Any

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.taps.base import (
    HttpTap,
    b64decode,
    clipped,
    inline_data,
    never_raises,
    pcm16,
)
from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.protocol.openai import AudioUrl, ImageUrl, ResponseImage, VideoUrl


def _last_user_parts(body: dict[str, Any]) -> list[Any]:
    """The content parts of the request's last user message (a string content is one text part)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    message = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
    if message is None:
        return []
    content = message.get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return parts if isinstance(parts, list) else []


def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _object(container: dict[str, Any], key: str) -> dict[str, Any]:
    """``container[key]`` if it is an object, else an empty one."""
    value = container.get(key)
    return value if isinstance(value, dict) else {}


class ChatTap(HttpTap):
    """``POST /v1/chat/completions``: the last user message and the answer, streamed (SSE) or whole (JSON): its
    text, its audio and the finished images it drew (previews of an image being drawn are not recorded)."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._audio_format = "wav"

    @never_raises
    def on_request(self, body: dict[str, Any]) -> None:
        """Open a turn with the request's last user message: text parts, audio (``input_audio``, ``audio_url``),
        images, videos (an event each)."""
        self._open_turn()
        self._audio_format = str(_object(body, "audio").get("format") or "wav")
        self.recorder.event("chat.request", model=clipped(body.get("model")), stream=bool(body.get("stream")),
                            modalities=clipped(body.get("modalities")), audio=clipped(body.get("audio")))
        media_readers = {"input_audio": self._input_audio, "image_url": self._image, "audio_url": self._audio_url,
                         "video_url": self._video_url}
        texts: list[str] = []
        for part in _last_user_parts(body):
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in media_readers:
                media_readers[kind](part.get(kind))
        text = " ".join(t.strip() for t in texts if t.strip())
        if text:
            self.recorder.user_text(text)

    @never_raises
    def _input_audio(self, audio: Any) -> None:
        """An ``input_audio`` part, saved in the format it names (``bin`` if none). Read by hand: the protocol's
        model takes fewer formats than the recording keeps."""
        if not isinstance(audio, dict):
            raise TypeError("input_audio: expected an object")
        data = b64decode(audio.get("data"))
        self.recorder.user_audio_encoded(data, str(audio.get("format") or "bin"), t_start=self._response_started_at)

    def _inline_part(self, kind: str, url: str) -> tuple[str, bytes] | None:
        """A media part's (mime type, bytes) when its URL is a base64 data URL; any other URL is recorded as an
        event of the part's ``kind`` (and None returned)."""
        inline = inline_data(url, f"{kind}.url")
        if inline is None:
            self.recorder.event(kind, url=clipped(url))
        return inline

    @never_raises
    def _image(self, image: Any) -> None:
        """An ``image_url`` part: a base64 data URL is saved; another URL is recorded as an event."""
        inline = self._inline_part("image_url", ImageUrl.model_validate(image).url)
        if inline is None:
            return
        mime, data = inline
        self.recorder.user_image(data, mime)

    @never_raises
    def _audio_url(self, audio: Any) -> None:
        """An ``audio_url`` part: a base64 data URL is saved like ``input_audio`` (its type names the format);
        another URL is recorded as an event."""
        inline = self._inline_part("audio_url", AudioUrl.model_validate(audio).url)
        if inline is None:
            return
        mime, data = inline
        self.recorder.user_audio_encoded(data, mime.rpartition("/")[2] or "bin", t_start=self._response_started_at)

    @never_raises
    def _video_url(self, video: Any) -> None:
        """A ``video_url`` part: a base64 data URL of a video type the recorder keeps is saved like an image;
        another URL (or a type it does not keep) is recorded as an event."""
        inline = self._inline_part("video_url", VideoUrl.model_validate(video).url)
        if inline is None:
            return
        mime, data = inline
        try:
            self.recorder.user_video(data, mime)
        except ValueError as exc:
            self.recorder.event("video_url", mime=mime, size_bytes=len(data), not_kept=str(exc))

    @never_raises
    def _answer_image(self, image: Any) -> None:
        """An image of ``message.images`` / ``delta.images``: the finished one (a PNG data URL) is saved; a
        preview (it has the denoising ``step``) is not."""
        drawn = ResponseImage.model_validate(image)
        if drawn.step is not None:
            return
        url = drawn.image_url.url
        inline = inline_data(url, "images[].image_url.url")
        if inline is None:
            raise ValueError(f"images[].image_url.url: expected a base64 data URL, got {clipped(url[:80])!r}")
        mime, data = inline
        self.recorder.ai_image(data, mime)

    def _answer_images(self, images: Any) -> None:
        for image in images if isinstance(images, list) else []:
            self._answer_image(image)

    def _finish_reason(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason"):
            self.recorder.metric("finish_reason", clipped(choice["finish_reason"]))

    def _answer_choice(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A completion's (or a streamed chunk's) first choice, its usage recorded; None for an error object,
        which is recorded instead."""
        if "error" in body:
            self._record_error(body["error"])
            return None
        if isinstance(body.get("usage"), dict):
            self.recorder.metric("usage", body["usage"])
        return _first_choice(body)

    @never_raises
    def on_sse_data(self, data: str) -> None:
        """One ``data:`` payload of a streamed completion: a chunk, an error object or ``[DONE]``."""
        payload = data.strip()
        if not payload or payload == "[DONE]":
            return
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            return
        choice = self._answer_choice(chunk)
        if choice is None:
            return
        delta = _object(choice, "delta")
        audio = _object(delta, "audio")
        # A spoken answer carries its text both as content and as audio.transcript: record it once.
        self._answer_text(delta.get("content") if isinstance(delta.get("content"), str) else audio.get("transcript"))
        if audio.get("data"):
            samples = pcm16(b64decode(audio["data"]))
            if samples.size:
                self._note_first_audio()
                self.recorder.ai_audio(samples, PCM16_RATE_HZ)
        self._answer_images(delta.get("images"))
        self._finish_reason(choice)

    @never_raises
    def on_json_response(self, body: dict[str, Any]) -> None:
        """A whole completion: ``message.content``, ``message.audio.data`` (a file in the requested
        ``audio.format``; ``pcm16`` is headerless 24 kHz) and the drawn ``message.images``."""
        choice = self._answer_choice(body)
        if choice is None:
            return
        message = _object(choice, "message")
        audio = _object(message, "audio")
        self._answer_text(message.get("content") if isinstance(message.get("content"), str)
                          else audio.get("transcript"))
        if audio.get("data"):
            data = b64decode(audio["data"])
            self._note_first_audio()
            if self._audio_format == "pcm16":
                self.recorder.ai_audio(pcm16(data), PCM16_RATE_HZ)
            else:
                self.recorder.ai_audio_encoded(data, self._audio_format)
        self._answer_images(message.get("images"))
        self._finish_reason(choice)
