"""A realtime session's own transcript of a spoken turn, made as the turn ends.

A pipeline whose transcription pipeline decodes in an encoder window fitted to the clip
(``ServingTraits.live_transcription``: the default family's whisper, ``fitted_window``) answers a spoken turn from
its transcript: one fitted-window pass over the turn's whole speech, run by the session at the pause that starts
a tentative answer or at the commit. That transcript is the turn's, for the answer and for
``conversation.item.input_audio_transcription.completed`` alike, so a turn is transcribed once and the answer does
not wait for the pipeline to hear the audio whole.

Passes while the user spoke, each going on from the words two passes before it agreed on, are gone: forcing those
words on the final pass kept their mistakes ("Who wrote wrong me" for Romeo; 5.5% word errors against 4.0%), and a
final pass over the whole speech costs no more than one that decodes only the tail (``omnipipe bench hearing``,
docs/benchmarks.md). They cost ~180 ms of a core each half second of speech for nothing.

A clip longer than a fitted window takes (``MAX_LIVE_AUDIO_S``) is transcribed in whole 30 s windows instead.

The pass runs on the server's transcription pipeline (``asr``: the same whisper encoder stage, in its own engine),
not on the answering pipeline's own encoder stage. The session needs the words before it asks for the answer (the
turn's item, the history the answer is planned from, the ``.completed`` event), and a pipeline gives out only its
final stages' outputs: through the ``default`` pipeline, the words would reach the thinker and never the session.
The ``asr`` engine serves ``/v1/audio/transcriptions`` too, so a server that transcribes keeps that second whisper
anyway; the cost of the separate request is one more hop over the engine's sockets (a few ms), not another decode.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.server.routes.realtime.audio_buffer import LISTEN_RATE_HZ
from omnipipe.server.routes.realtime.transcription import transcribe

if TYPE_CHECKING:
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.server.engines import EnginePool
    from omnipipe.server.realtime_settings import Settings

# the pass's extras: the whole speech in a fitted window (whisper's timestamps kept, a window of at least 20 s:
# ``models/default/modeling/whisper.py``)
FINAL_EXTRA: dict[str, Any] = {"fitted_window": True}
MAX_LIVE_AUDIO_S = 28.0  # whisper's fitted window takes 29 s (``WhisperASR.start_fitted``)


class LiveTranscript:
    """A session's transcripts of its spoken turns (``final``), when the session makes them itself (``enabled``).
    ``settings``: the session's (whether it wants them), changed in place by ``session.update``; ``pipeline``: the
    session's (whether it can); ``pool``: the server's engines (the transcription pipeline)."""

    def __init__(self, settings: Settings, pipeline: PipelineSpec, pool: EnginePool) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.pool = pool

    def enabled(self) -> bool:
        """Whether this session's spoken turns are transcribed by the session (the pipeline can, the session wants
        it)."""
        return (self.settings.live_transcription and self.pipeline.serving.live_transcription
                and self.pool.endpoint_pipelines.get("transcription") is not None)

    def warm_up(self) -> None:
        """Start the transcription pipeline now (it starts on first use), so the first turn does not wait for it."""
        if self.enabled():
            task = asyncio.create_task(self.pool.engine_for("transcription"), name="omnipipe-live-warm-up")
            # a failure is the slot's, met again (and reported) by the first transcript
            task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def final(self, audio: np.ndarray) -> str:
        """The turn's transcript of its speech (``audio``, at ``LISTEN_RATE_HZ``): decoded whole in a fitted window
        (``FINAL_EXTRA``; in 30 s windows when too long for one). Raises what the transcription pipeline raised."""
        if audio.size > MAX_LIVE_AUDIO_S * LISTEN_RATE_HZ:
            return await transcribe(self.pool, audio, rate_hz=LISTEN_RATE_HZ)
        return await transcribe(self.pool, audio, dict(FINAL_EXTRA), rate_hz=LISTEN_RATE_HZ)
