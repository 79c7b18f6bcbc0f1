"""A duplex family's realtime session (``ServingTraits.duplex``: Moshi). The model listens and speaks at the same
time, so the session has no turns: its first ``input_audio_buffer.append`` starts one response that lasts until the
session ends. The user's audio streams into the pipeline as it comes (24 kHz pcm16, resampled to the engine's
16 kHz, ``AsyncOmni.append_audio``); the model's speech comes back as ``response.output_audio.delta`` and its
inner-monologue text as ``response.output_audio_transcript.delta``, a frame of each per 80 ms of the user's audio.
The session's temperature (beta dialect) and ``max_output_tokens`` (a cap in 80 ms frames heard) go to the model.
Whether the model talks over the user or falls silent for them is its own behaviour: nothing is cancelled.

What belongs to turns has no place here and is refused by name: a turn detection in ``session.update``,
``input_audio_buffer.commit``/``clear``, ``response.create``/``cancel``, conversation items, a pause. The output
modalities are fixed once the audio has started. The session's end (the client closing, or a server timeout) ends
the stream; the response ends ``completed`` when the model has heard it all, ``cancelled`` when the connection went
first."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.server.realtime_settings import Settings
from omnipipe.server.routes.realtime.checks import decode_pcm16
from omnipipe.server.routes.realtime.events import EventError
from omnipipe.server.routes.realtime.response import AnswerPlan, Responses

ENGINE_RATE_HZ = 16000  # what AsyncOmni.append_audio takes
# the engine's fields a duplex request can be refused for -> the client's
_FIELDS = {"prompt.multi_modal_data.audio": "audio", "prompt.multi_modal_data": "audio", "prompt": "audio"}


class DuplexTalk:
    """The session's one long response. ``settings``: the session's (its modalities read when the audio starts);
    ``pipeline``, ``engine`` and ``session_id``: the session's; ``responses``: the session's response, which sends
    the stream's events."""

    def __init__(self, settings: Settings, pipeline: PipelineSpec, engine: AsyncOmni, session_id: str, *,
                 responses: Responses) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.engine = engine
        self.session_id = session_id
        self.responses = responses
        self.stream_id = f"{session_id}-duplex"
        self.started = False
        self._resampler: Any = None

    async def append(self, event: Any) -> None:
        """``input_audio_buffer.append``: the audio streamed into the model at once (the first starts the
        response)."""
        samples = decode_pcm16(event.audio, "audio")
        if not self.started:
            await self._start()
        if samples.size == 0:
            return
        heard = np.asarray(self._resampler.resample_chunk(samples), dtype=np.float32)
        if heard.size:
            await self.engine.append_audio(self.stream_id, heard, session_id=self.session_id)

    async def _start(self) -> None:
        import soxr

        self._resampler = soxr.ResampleStream(PCM16_RATE_HZ, ENGINE_RATE_HZ, 1, dtype="float32")
        modalities, limit = list(self.settings.modalities), self.settings.max_output_tokens
        plan = AnswerPlan(prompt={"prompt": "", "multi_modal_data": {"audio": [{"stream": self.stream_id}]}},
                          modalities=modalities, sampling=self.responses.sampling(modalities, limit) or None,
                          fields=_FIELDS, max_output_tokens=limit, spoken_turn=False)
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.started = True
        self.responses.run(response_id, plan, self.responses.generate(response_id, plan))

    def refuse(self, kind: str) -> None:
        """An event that belongs to turns: an EventError naming its type."""
        raise EventError(f"type: {kind} has no place in a duplex session (pipeline {self.pipeline.name!r} listens "
                         "and speaks at the same time, with no turns: send input_audio_buffer.append only)", "type",
                         code="unsupported_event")

    def check_change(self, key: str, value: Any, param: str) -> None:
        """A ``session.update`` change a duplex session cannot take: an EventError naming its field."""
        if key == "turn_detection" and value is not None:
            raise EventError(f"{param}: pipeline {self.pipeline.name!r} is full duplex: it decides itself when to "
                             "speak, so it takes no turn detection (null)", param, code="unsupported_feature")
        if key == "modalities" and self.started and list(value) != list(self.settings.modalities):
            raise EventError(f"{param}: a duplex session's output modalities are fixed once its audio has started",
                             param, code="unsupported_parameter")
        if key == "transcription" and value is not None:
            raise EventError(f"{param}: a duplex session does not transcribe the user's audio (the model hears it "
                             "whole; its own words come as the transcript)", param, code="unsupported_feature")

    async def close(self) -> None:
        """The session ended: the stream is dropped and the response cancelled (the client is gone; what the
        resampler still holds, a few ms, is not sent)."""
        if not self.started:
            return
        try:
            await self.engine.drop_audio_stream(self.stream_id)
        finally:
            await self.responses.cancel("session_closed")
