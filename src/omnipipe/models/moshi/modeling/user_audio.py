"""The user's side of a duplex session: audio heard in pieces at 16 kHz (what ``AsyncOmni.append_audio`` carries)
-> Mimi's 24 kHz -> one frame of ``num_codebooks`` codes per 1920 samples (80 ms), each frame encoded as soon as it
is whole.

- ``Upsampler``: 16 kHz -> 24 kHz (3 up, 2 down) through a fixed polyphase windowed-sinc low-pass (cut at 7.2 kHz,
  ``TAPS_PER_PHASE`` taps a phase, causal: half a millisecond of delay). Each output sample is a sum over the taps in
  a fixed order in float64, so the samples are the same to the bit however the input is cut into pieces: a stream
  heard piece by piece gives what the whole clip gives at once. ``n`` input samples give ``ceil(3n / 2)`` outputs.
- ``HeardAudio``: a stream's samples upsampled and encoded as they come by Mimi's streaming encoder
  (``models/mimi/modeling/stream.py``: bit-equal to one ``encode`` of the whole clip), its codes queued frame by
  frame; at its end, the last partial frame is encoded padded with zeros.
- ``UserFrames``: a session's source of user frames: audio heard, codes given as they are, or ``generate``'s silence
  (the codes of one frame of zeros encoded alone, every frame, without end)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from omnipipe.models.mimi.modeling.stream import MimiEncodeStream

if TYPE_CHECKING:
    from transformers import MimiModel

INPUT_RATE_HZ = 16_000
TAPS_PER_PHASE = 16
_UP, _DOWN = 3, 2  # 16 kHz x 3 / 2 = 24 kHz


def _phases() -> np.ndarray:
    """The low-pass at 48 kHz (``3 x TAPS_PER_PHASE`` taps, unit gain at DC per phase once zero-stuffed), as
    [phase, tap]: output ``j`` reads input ``floor(2j / 3) - m`` with weight ``[2j mod 3, m]``."""
    taps = _UP * TAPS_PER_PHASE
    cutoff = 0.45 * INPUT_RATE_HZ / (_UP * INPUT_RATE_HZ)  # 7.2 kHz over 48 kHz
    t = np.arange(taps) - (taps - 1) / 2
    h = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(taps, 8.0)
    h *= _UP / h.sum()
    return h.reshape(TAPS_PER_PHASE, _UP).T.copy()


_PHASES = _phases()


class Upsampler:
    """16 kHz float samples in pieces -> 24 kHz float32 samples as soon as the filter has read their inputs."""

    def __init__(self) -> None:
        self._kept = np.zeros(TAPS_PER_PHASE - 1)  # the inputs the next outputs may read, float64
        self._first = -(TAPS_PER_PHASE - 1)  # the input index of _kept[0] (before the clip: zeros)
        self.produced = 0  # output samples so far

    def __call__(self, pcm16k: np.ndarray) -> np.ndarray:
        kept = np.concatenate([self._kept, np.asarray(pcm16k, dtype=np.float64).reshape(-1)])
        heard = self._first + len(kept)  # input samples so far
        end = (_UP * heard + 1) // _DOWN
        j = np.arange(self.produced, end)
        base, phase = (_DOWN * j) // _UP, (_DOWN * j) % _UP
        out = np.zeros(len(j))
        for tap in range(TAPS_PER_PHASE):  # a fixed order: the same sums whatever the pieces
            out += kept[base - tap - self._first] * _PHASES[phase, tap]
        self.produced = end
        drop = (_DOWN * end) // _UP - (TAPS_PER_PHASE - 1) - self._first  # inputs no later output reads
        if drop > 0:
            kept, self._first = kept[drop:], self._first + drop
        self._kept = kept
        return out.astype(np.float32)


def upsample(pcm16k: np.ndarray) -> np.ndarray:
    """A whole clip at 16 kHz -> 24 kHz (what a stream of the same samples gives, piece by piece)."""
    return Upsampler()(pcm16k)


def silence_codes(mimi: torch.nn.Module, codebooks: int) -> torch.Tensor:
    """What ``generate`` feeds as the user's frame after its prompt: the codes [K] of one frame of zeros, encoded
    alone."""
    model = cast("MimiModel", mimi)
    param = next(model.parameters())
    frame = torch.zeros(1, 1, int(model.config.frame_size), dtype=param.dtype, device=param.device)
    with torch.inference_mode():
        codes = model.encode(frame, num_quantizers=codebooks).audio_codes
    assert codes is not None
    return codes[0, :, 0]


class HeardAudio:
    """A stream's user frames as it is heard (``append``, 16 kHz pieces) until ``close``: each frame's codes [K] (on
    the encoder's device) queued once its samples are in; ``take`` removes the next. ``error`` says why a stream
    failed (its frames then never come)."""

    def __init__(self, encoder: MimiEncodeStream) -> None:
        self.encoder = encoder
        self._upsampler = Upsampler()
        self._frames: deque[torch.Tensor] = deque()
        self.closed = False
        self.error: str | None = None
        self.heard_samples = 0  # at 16 kHz, every append

    def append(self, pcm16k: np.ndarray) -> None:
        if self.closed:
            raise ValueError("the audio stream is closed")
        self.heard_samples += int(np.asarray(pcm16k).size)
        self._queue(self.encoder.encode(self._upsampler(pcm16k)))

    def close(self) -> None:
        """No more audio: a last partial frame is encoded padded with zeros."""
        if not self.closed:
            self.closed = True
            self._queue(self.encoder.flush())

    def fail(self, error: str) -> None:
        self.error, self.closed = error, True
        self._frames.clear()

    def _queue(self, codes: torch.Tensor) -> None:
        self._frames.extend(codes.unbind(1))

    @property
    def frames_ready(self) -> int:
        return len(self._frames)

    def take(self) -> torch.Tensor:
        """The next frame's codes [K]; call only with ``frames_ready``."""
        return self._frames.popleft()


class UserFrames:
    """A session's user frames, one per step: ``ready`` (the next is here), ``ended`` (no more will come), ``next``
    (its codes [K]). One of: ``audio`` heard, ``codes`` given [K, N], or ``silence`` (the same codes every frame, never
    ending)."""

    def __init__(self, *, audio: HeardAudio | None = None, codes: torch.Tensor | None = None,
                 silence: torch.Tensor | None = None) -> None:
        if sum(source is not None for source in (audio, codes, silence)) != 1:
            raise ValueError("user frames come from one source: audio heard, codes, or silence")
        self.audio, self.codes, self.silence = audio, codes, silence
        self.taken = 0

    @property
    def ready(self) -> bool:
        if self.audio is not None:
            return self.audio.frames_ready > 0
        if self.codes is not None:
            return self.taken < self.codes.shape[1]
        return True

    @property
    def error(self) -> str | None:
        """Why the user's audio stream failed (None: it did not)."""
        return None if self.audio is None else self.audio.error

    @property
    def ended(self) -> bool:
        if self.audio is not None:
            return self.audio.closed and not self.ready
        return self.codes is not None and not self.ready

    def next(self) -> torch.Tensor:
        self.taken += 1
        if self.audio is not None:
            return self.audio.take()
        if self.codes is not None:
            return self.codes[:, self.taken - 1]
        assert self.silence is not None
        return self.silence
