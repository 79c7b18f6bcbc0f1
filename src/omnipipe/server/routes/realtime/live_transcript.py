"""Live transcription of a realtime session's input audio, while the user speaks.

A pipeline whose transcription pipeline decodes live passes (``ServingTraits.live_transcription``: the default
family's whisper, ``fitted_window`` + ``prefix``) answers a spoken turn from its transcript. While audio arrives, a
pass over the speech so far runs each time ``PASS_EVERY_S`` more has come (one pass at a time); a word two passes
in a row heard at the same place is settled (local agreement; the last word of a pass may be cut off mid-word, so
never settles) and every later pass starts from the settled words, decoding only the rest. At the end of the turn
one final pass decodes the whole speech (``FINAL_EXTRA``: the settled words are not forced on it): that transcript
is the turn's, for the answer and for ``conversation.item.input_audio_transcription.completed`` alike, so a turn is
transcribed once.

A clip longer than a live pass takes (``MAX_LIVE_AUDIO_S``) is transcribed whole at the end instead.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.server.routes.realtime.audio_buffer import LISTEN_RATE_HZ
from omnipipe.server.routes.realtime.transcription import transcribe

if TYPE_CHECKING:
    from omnipipe.server.routes.realtime.core import SessionCore

logger = logging.getLogger(__name__)

# a pass costs ~100-150 ms of one core on the 2-core box (a short clip, 10 s window; ~180 ms in the 20 s window
# whisper now fits, ``FITTED_MIN_WINDOW_S``); twice a second of speech settles words sooner than once (measured
# when the final pass decoded only the tail after them)
PASS_EVERY_S = 0.5
# live passes in flight in the whole server at once: with more sessions speaking, each one's passes come less often
# rather than queueing beside the answers being made (a turn's final pass is never held back)
MAX_PASSES_IN_FLIGHT = 1
# the final pass's extras: the whole speech in a fitted window, no prefix. Words settled from passes over speech cut
# off mid-word stay wrong when forced on it ("How many likes does", "Who wrote wrong me", "What gas do you plan")
# where the whole speech is heard right, and they saved no time (``omnipipe bench hearing``, 96 clips: 5.5% word
# errors with them against 4.0% without; a final pass 268 against 263 ms)
FINAL_EXTRA: dict[str, Any] = {"fitted_window": True}
MAX_LIVE_AUDIO_S = 28.0  # whisper's fitted window takes 29 s (``WhisperASR.start_fitted``)


def _key(word: str) -> str:
    """A word as two passes are compared: case and punctuation do not count."""
    return re.sub(r"[^\w']", "", word.lower())


class SettledWords:
    """The words of a live transcript that no later pass may change."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self._last: list[str] | None = None  # the previous pass's words

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def heard(self, text: str) -> None:
        """A pass's transcript (which starts with the settled words): settle what it agrees on with the one
        before it, but its last word."""
        words = text.split()
        if self._last is not None:
            agreed = 0
            for mine, theirs in zip(words[:-1], self._last, strict=False):
                if _key(mine) != _key(theirs):
                    break
                agreed += 1
            if agreed > len(self.words):
                self.words = words[:agreed]
        self._last = words


def _pass_ended(_: asyncio.Task[None]) -> None:
    LiveTranscript.passes_in_flight -= 1


class LiveTranscript:
    """One turn's live transcript: passes while the audio arrives, ``final`` at its end; ``reset`` for the next."""

    passes_in_flight = 0  # of every session of this server process (see MAX_PASSES_IN_FLIGHT)

    def __init__(self, session: SessionCore) -> None:
        self.session = session
        self.settled = SettledWords()
        self._pass: asyncio.Task[None] | None = None
        self._passed_samples = 0  # the audio the latest pass started from

    def enabled(self) -> bool:
        """Whether this session's spoken turns are transcribed live (the pipeline can, the session wants it)."""
        session = self.session
        return (session.settings.live_transcription and session.pipeline.serving.live_transcription
                and session.pool.endpoint_pipelines.get("transcription") is not None)

    def warm_up(self) -> None:
        """Start the transcription pipeline now (it starts on first use), so the first turn does not wait for it."""
        if self.enabled():
            task = asyncio.create_task(self.session.pool.engine_for("transcription"), name="omnipipe-live-warm-up")
            # a failure is the slot's, met again (and reported) by the first pass
            task.add_done_callback(lambda done: done.cancelled() or done.exception())

    def heard(self, samples: int, speech: Callable[[], np.ndarray]) -> None:
        """The turn's speech so far is ``samples`` long (the input's 16 kHz stream, ``LISTEN_RATE_HZ``; ``speech``
        gives it): start a pass when enough is new and none is running."""
        if self._pass is not None and not self._pass.done():
            return
        too_long = samples > MAX_LIVE_AUDIO_S * LISTEN_RATE_HZ
        if too_long or samples - self._passed_samples < PASS_EVERY_S * LISTEN_RATE_HZ \
                or LiveTranscript.passes_in_flight >= MAX_PASSES_IN_FLIGHT:
            return
        self._passed_samples = samples
        LiveTranscript.passes_in_flight += 1
        self._pass = asyncio.create_task(self._run_pass(speech()), name="omnipipe-live-transcript-pass")
        self._pass.add_done_callback(_pass_ended)  # also for a pass cancelled before it ran

    async def _run_pass(self, audio: np.ndarray) -> None:
        try:
            text = await transcribe(self.session, audio, {"fitted_window": True, "prefix": self.settled.text},
                                    rate_hz=LISTEN_RATE_HZ)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a failed pass settles nothing; the final one reports what fails
            logger.debug("a live transcription pass failed", exc_info=True)
            return
        self.session.metrics.count_live_transcription_pass()
        self.settled.heard(text)

    async def final(self, audio: np.ndarray) -> str:
        """The turn's transcript of its speech (``audio``, at ``LISTEN_RATE_HZ``): decoded whole in a fitted window
        (``FINAL_EXTRA``; in 30 s windows when too long for one). Raises what the transcription pipeline raised."""
        await self._stop_pass()
        if audio.size > MAX_LIVE_AUDIO_S * LISTEN_RATE_HZ:
            return await transcribe(self.session, audio, rate_hz=LISTEN_RATE_HZ)
        return await transcribe(self.session, audio, dict(FINAL_EXTRA), rate_hz=LISTEN_RATE_HZ)

    async def reset(self) -> None:
        """Forget the turn (its pass in flight stopped)."""
        await self._stop_pass()
        self.settled = SettledWords()
        self._passed_samples = 0

    async def _stop_pass(self) -> None:
        """Cancel the pass in flight (its request ends with it: ``generate`` aborts a request left unfinished)."""
        task, self._pass = self._pass, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
