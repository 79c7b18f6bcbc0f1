"""Audio that streams into a thinker: its log-mel features and its audio encoder's output computed while the user
speaks, so that the end of the clip only adds the tail. ``finish`` gives what the whole clip gives at once: the
feature extractor's tensors exactly, and the encoder output of the same features (see ``StreamedAudio``).

What is incremental, for Whisper's log-mel (``transformers``' ``WhisperFeatureExtractor``, torch path):

- the STFT is centred (``n_fft // 2`` samples of reflect padding each side) with hop ``hop_length``: frame ``t``
  reads samples ``[t * hop - n_fft / 2, t * hop + n_fft / 2)``. A frame whose window lies inside the samples heard
  so far is final (its power spectrum is bit-identical to the whole clip's); the frames that reach past the end
  (reflect or zero padding) are made at ``finish``.
- the mel projection is one matrix product whose rounding can depend on how many frames it is given; ``finish``
  redoes it over every frame's (kept) power spectrum, the exact call the extractor makes (a few ms for 30 s).
- the normalisation (``max(x, max(x) - 8)``, then ``(x + 4) / 4``) reads the clip's global maximum, known only at
  the end. Streamed features are normalised with the maximum so far.

What is incremental for an encoder is the family's (``ChunkEncoder``): its features cut into chunks of
``chunk_frames`` that the model convolves independently, grouped ``window_chunks`` at a time into the windows its
attention stays within. A chunk is embedded once its frames are in, a window encoded once its chunks are; a
floor raised by a louder frame later makes the chunks it changes stale, and they are redone as the next chunk
completes (while the user still speaks). ``finish`` compares every chunk's input with the exact final features:
an equal one keeps its work, any other (and the tail) is redone. So the encoder output is always that of the exact
features; it differs from the whole clip's encoder call only where the kernels' rounding depends on how many
chunks one call holds (the bound each family's test states)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from omnipipe.stage.runner import StageRunner
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 16_000
AUDIO_FIELD = "prompt.multi_modal_data.audio"
MAX_OPEN_STREAMS = 32  # a stage's open streams (beyond: the least recently appended one is dropped)
MAX_STREAM_S = 300.0  # seconds of audio one stream may hold
_MEL_BLOCK_FRAMES = 16  # streamed mel products over aligned blocks of this many frames (the whole product's panels)


class ChunkEncoder(Protocol):
    """A family's audio encoder cut where the model cuts it."""

    chunk_frames: int  # log-mel frames the encoder convolves alone
    window_chunks: int  # chunks its attention spans

    def embed(self, features: torch.Tensor, padded_frames: int) -> torch.Tensor:
        """One chunk's normalised features [mel, n] (right-padded with zeros to ``padded_frames`` where the whole
        clip's call pads it) -> its embedding, what ``encode`` reads."""
        ...

    def encode(self, embeds: list[torch.Tensor], frames: list[int]) -> torch.Tensor:
        """One attention window's chunk embeddings (each of ``frames`` frames) -> its encoder output [tokens, D]."""
        ...


@dataclass
class StreamedAudio:
    """A finished stream: ``input_features`` [1, mel, frames] and ``feature_attention_mask`` [1, frames] as the feature
    extractor gives them for the whole clip, and ``audio_embeds`` [tokens, D], the audio encoder's output (what the
    thinker's ``get_audio_features`` returns); ``stats``: the work done after the last append and before it."""

    input_features: torch.Tensor
    feature_attention_mask: torch.Tensor
    audio_embeds: torch.Tensor | None
    stats: dict[str, int] = field(default_factory=dict)


class LogMelStream:
    """Whisper log-mel features of a clip heard in pieces (float32 at 16 kHz). ``length_samples``: None takes the clip
    as it is (``padding="longest", truncation=False``); a number cuts the clip there and zero-pads it to that many
    samples (``padding="max_length"`` with truncation, Qwen2.5-Omni's processor)."""

    def __init__(self, feature_extractor: Any, length_samples: int | None = None) -> None:
        if float(getattr(feature_extractor, "dither", 0.0)) != 0.0:
            raise ValueError("a streamed log-mel needs a feature extractor without dither (it draws noise)")
        if int(feature_extractor.sampling_rate) != SAMPLE_RATE_HZ:
            raise ValueError(f"expected a {SAMPLE_RATE_HZ} Hz feature extractor, got {feature_extractor.sampling_rate}")
        self.n_fft, self.hop = int(feature_extractor.n_fft), int(feature_extractor.hop_length)
        self.window = torch.hann_window(self.n_fft)
        self.mel_filters = torch.from_numpy(feature_extractor.mel_filters).to(torch.float32)
        self.length_samples = length_samples
        self._pcm = np.zeros(SAMPLE_RATE_HZ, dtype=np.float32)
        self.samples = 0  # kept so far (at most length_samples)
        self.power: list[torch.Tensor] = []  # [freq, n] blocks of final frames' power spectra
        self.power_frames = 0
        self.log_mel: list[torch.Tensor] = []  # [mel, n] blocks, before normalisation
        self.mel_frames = 0
        self.running_max = -float("inf")

    def append(self, pcm: np.ndarray) -> None:
        """Hear more of the clip; every frame it settles is computed now."""
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self.length_samples is not None:
            pcm = pcm[:max(0, self.length_samples - self.samples)]
        if self.samples + len(pcm) > len(self._pcm):
            grown = np.zeros(max(2 * len(self._pcm), self.samples + len(pcm)), dtype=np.float32)
            grown[:self.samples] = self._pcm[:self.samples]
            self._pcm = grown
        self._pcm[self.samples:self.samples + len(pcm)] = pcm
        self.samples += len(pcm)
        half = self.n_fft // 2
        # frame t reads samples up to t * hop + half - 1; the first also reflects sample `half`
        settled = (self.samples - half - 1) // self.hop + 1 if self.samples > half else 0
        self._power_until(settled, self.samples)
        self._mel_until(self.power_frames - self.power_frames % _MEL_BLOCK_FRAMES)

    @property
    def total_frames(self) -> int:
        """The clip's frame count, once it is whole (as the extractor: ``length // hop``)."""
        return (self.length_samples if self.length_samples is not None else self.samples) // self.hop

    def valid_frames(self) -> int:
        """Frames of the clip itself (the rest is padding), as the extractor's attention mask counts them."""
        return min(self.total_frames, -(-self.samples // self.hop))

    def normalised(self, start: int, end: int, maximum: float) -> torch.Tensor:
        """Streamed frames ``[start, end)`` normalised with ``maximum`` as the clip's maximum."""
        raw = self._mel_range(start, end)
        return (torch.maximum(raw, torch.tensor(maximum - 8.0)) + 4.0) / 4.0

    def raw_min(self, start: int, end: int) -> float:
        return float(self._mel_range(start, end).min())

    def finish(self) -> torch.Tensor:
        """The whole clip's features [mel, frames], exactly as the extractor makes them."""
        self._power_until(self.total_frames, self.length_samples if self.length_samples is not None
                          else self.samples)
        if self.length_samples is None and self.samples <= self.n_fft // 2:
            raise ValueError(f"the audio clip is too short: {self.samples} samples (at least "
                             f"{self.n_fft // 2 + 1} are needed)")
        log_spec = torch.clamp(self.mel_filters.T @ self._power()[None], min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max(dim=2, keepdim=True)[0].max(dim=1, keepdim=True)[0] - 8.0)
        return ((log_spec + 4.0) / 4.0)[0]

    # --------------------------------------------------------------------------------------------- internals
    def _power_until(self, frames: int, length: int) -> None:
        """Power spectra of frames up to ``frames`` over a signal of ``length`` samples (kept samples, then zeros),
        reflect-padded at both ends. A frame that reads only the zero padding is zero (as its STFT is)."""
        start, half = self.power_frames, self.n_fft // 2
        if frames <= start:
            return
        silent_from = min(frames, max(start, -(-(self.samples + half) // self.hop)))
        silent_to = min(frames, max(silent_from, (length - half) // self.hop + 1))
        self._stft(start, silent_from, length)
        if silent_to > silent_from:
            self.power.append(torch.zeros(half + 1, silent_to - silent_from))
        self._stft(silent_to, frames, length)
        self.power_frames = frames

    def _stft(self, start: int, end: int, length: int) -> None:
        if end <= start:
            return
        index = np.arange(start * self.hop, (end - 1) * self.hop + self.n_fft) - self.n_fft // 2
        index = np.abs(index)  # the left reflection
        index = np.where(index >= length, 2 * (length - 1) - index, index)  # the right one
        signal = np.where(index < self.samples, self._pcm[np.minimum(index, self.samples - 1)], 0.0)
        stft = torch.stft(torch.from_numpy(signal.astype(np.float32)), self.n_fft, self.hop, window=self.window,
                          center=False, return_complex=True)
        self.power.append((stft.abs() ** 2).contiguous())

    def _mel_until(self, frames: int) -> None:
        if frames <= self.mel_frames:
            return
        power = self._power()[:, self.mel_frames:frames].contiguous()
        log_mel = torch.clamp(self.mel_filters.T @ power[None], min=1e-10).log10()[0]
        self.log_mel = [torch.cat([*self.log_mel, log_mel], dim=1)]
        self.mel_frames = frames
        self.running_max = max(self.running_max, float(log_mel.max()))

    def _power(self) -> torch.Tensor:
        """Every computed frame's power spectrum [freq, frames], contiguous."""
        if len(self.power) > 1:
            self.power = [torch.cat(self.power, dim=1)]
        return self.power[0]

    def _mel_range(self, start: int, end: int) -> torch.Tensor:
        return self.log_mel[0][:, start:end]


@dataclass
class _Chunk:
    features: torch.Tensor  # the normalised features it was embedded from
    maximum: float  # the clip's maximum as it was then
    raw_min: float
    embed: torch.Tensor


class StreamingAudioInput:
    """One clip streamed into a thinker: ``append`` 16 kHz float32 pieces as they arrive, ``finish`` once at the
    end of speech. Without an ``encoder`` only the features stream."""

    def __init__(self, features: LogMelStream, encoder: ChunkEncoder | None = None) -> None:
        self.features, self.encoder = features, encoder
        self._chunks: list[_Chunk] = []
        self._windows: dict[int, torch.Tensor] = {}  # window index -> its output, while its chunks are current
        self.stats = {"chunks_streamed": 0, "windows_streamed": 0, "chunks_redone_streaming": 0}
        self.finished = False

    def append(self, pcm: np.ndarray) -> None:
        if self.finished:
            raise RuntimeError("the audio stream is finished")
        before = self.features.mel_frames
        self.features.append(pcm)
        if self.encoder is None or self.features.mel_frames == before:
            return
        size = self.encoder.chunk_frames
        complete = self.features.mel_frames // size
        if complete > len(self._chunks):
            self._refresh_stale()
            while len(self._chunks) < complete:
                self._chunks.append(self._embed(len(self._chunks)))
                self.stats["chunks_streamed"] += 1
            per = self.encoder.window_chunks
            for window in range(complete // per):
                if window not in self._windows:
                    chunks = self._chunks[window * per:(window + 1) * per]
                    self._windows[window] = self.encoder.encode([c.embed for c in chunks], [size] * per)
                    self.stats["windows_streamed"] += 1

    def finish(self) -> StreamedAudio:
        """The whole clip's features and encoder output."""
        self.finished = True
        final = self.features.finish()
        valid = self.features.valid_frames()
        mask = torch.zeros(1, final.shape[1], dtype=torch.long)
        mask[0, :valid] = 1
        stats = {**self.stats, "chunks_redone": 0, "chunks_kept": 0, "windows_kept": 0, "windows_redone": 0}
        if self.encoder is None or valid == 0:
            return StreamedAudio(final[None], mask, None, stats)
        size, per = self.encoder.chunk_frames, self.encoder.window_chunks
        padded = size if valid >= size else valid
        count = -(-valid // size)
        embeds: list[torch.Tensor] = []
        for index in range(count):
            start, end = index * size, min(valid, (index + 1) * size)
            exact = final[:, start:end]
            kept = self._chunks[index] if index < len(self._chunks) and end - start == size else None
            if kept is not None and torch.equal(kept.features, exact):
                embeds.append(kept.embed)
                stats["chunks_kept"] += 1
                continue
            self._windows.pop(index // per, None)
            embeds.append(self.encoder.embed(exact, padded))
            stats["chunks_redone"] += 1
        outputs = []
        for window in range(-(-count // per)):
            chunk_range = range(window * per, min(count, (window + 1) * per))
            if window in self._windows and len(chunk_range) == per:
                outputs.append(self._windows[window])
                stats["windows_kept"] += 1
                continue
            frames = [min(valid, (i + 1) * size) - i * size for i in chunk_range]
            outputs.append(self.encoder.encode([embeds[i] for i in chunk_range], frames))
            stats["windows_redone"] += 1
        return StreamedAudio(final[None], mask, torch.cat(outputs), stats)

    def _embed(self, index: int) -> _Chunk:
        assert self.encoder is not None
        size = self.encoder.chunk_frames
        start, end = index * size, (index + 1) * size
        maximum = self.features.running_max
        features = self.features.normalised(start, end, maximum)
        return _Chunk(features, maximum, self.features.raw_min(start, end), self.encoder.embed(features, size))

    def _refresh_stale(self) -> None:
        """Redo the chunks whose features a louder frame has changed since (and forget their windows' output)."""
        assert self.encoder is not None
        maximum = self.features.running_max
        for index, chunk in enumerate(self._chunks):
            if chunk.maximum != maximum and chunk.raw_min < maximum - 8.0:
                self._chunks[index] = self._embed(index)
                self._windows.pop(index // self.encoder.window_chunks, None)
                self.stats["chunks_redone_streaming"] += 1


def streamed_clip(audios: list[Any], field: str = AUDIO_FIELD) -> StreamedAudio | None:
    """The request's audio as a finished stream, if it is one (it must then be its only clip: the whole-clip
    extractor pads several clips to the longest, which a clip streamed alone never is)."""
    streamed = [clip for clip in audios if isinstance(clip, StreamedAudio)]
    if not streamed:
        return None
    if len(audios) != 1:
        raise FieldError(field, "a streamed clip must be the request's only audio")
    return streamed[0]


def merge_audio_embeds(embedding: torch.nn.Module, input_ids: torch.Tensor, audio_token_id: int,
                       audio_embeds: torch.Tensor) -> torch.Tensor:
    """The prompt's input embeddings [1, T, D] with ``audio_embeds`` [tokens, D] at its audio placeholders, as a
    thinker's forward merges its audio tower's output: given as ``inputs_embeds`` (beside ``input_ids``, without
    ``input_features``), the tower does not run again."""
    embeds = embedding(input_ids)
    mask = input_ids == audio_token_id
    if int(mask.sum()) != int(audio_embeds.shape[0]):
        raise ValueError(f"the prompt has {int(mask.sum())} audio placeholders for {audio_embeds.shape[0]} "
                         "encoded audio frames")
    return embeds.masked_scatter(mask[..., None].expand_as(embeds), audio_embeds.to(embeds.device, embeds.dtype))


def checked_stream_audio(audios: list[Any], field: str) -> list[dict[str, str]] | None:
    """A prompt's audio items (in the engine's prompt processor): ``[{"stream": id}]`` (a stream appended to with
    ``AsyncOmni.append_audio``) passes on unchanged, checked; None when no item is a dict (clips, for the
    processor to load). A dict of another form, or a stream beside other clips, is refused naming it."""
    if not any(isinstance(item, dict) for item in audios):
        return None
    for index, item in enumerate(audios):
        where = f"{field}[{index}]"
        if not isinstance(item, dict):
            continue
        if set(item) != {"stream"}:
            raise FieldError(where, f"a dict must be {{'stream': id}} (audio appended with append_audio), got the "
                                    f"keys {sorted(map(str, item))}")
        if not isinstance(item["stream"], str) or not item["stream"]:
            raise FieldError(f"{where}.stream", "must be a non-empty string (the id given to append_audio)")
    if len(audios) != 1:
        raise FieldError(field, "a streamed clip must be the request's only audio")
    return [{"stream": audios[0]["stream"]}]


def stream_reference(audios: Any) -> str | None:
    """The stream id of a request's audio given as ``[{"stream": id}]`` (the form the prompt processors pass on),
    None for audio given as clips."""
    if isinstance(audios, list) and len(audios) == 1 and isinstance(audios[0], dict):
        stream_id = audios[0].get("stream")
        return stream_id if isinstance(stream_id, str) else None
    return None


@dataclass
class _OpenStream:
    stream: StreamingAudioInput | None  # None once it failed (``error``)
    session_id: str | None
    next_seq: int = 0
    samples: int = 0
    used_at: float = field(default_factory=time.monotonic)
    error: str | None = None  # set on the stage loop or the processing thread; read on the processing thread


class AudioStreams:
    """A thinker stage's open audio streams, by id: each made by ``new_stream`` on its first append, fed on the
    runner's prompt-processing thread (``run``: a stream is not thread-safe, and that thread also finishes it, after
    every append that came before the request on the stage's control socket).

    The stage loop calls ``append``, ``drop``, ``end_session``, ``claim`` (a request admitted with the audio
    ``[{"stream": id}]`` takes its stream out of the map) and ``release`` (the request left the stage); the
    processing thread calls ``resolve`` (the request's item with the finished stream as its only audio).

    Limits: ``max_streams`` open streams (a new one beyond drops the least recently appended, whose request then
    finds it unknown) and ``max_seconds`` of audio each (a longer stream fails, and so does the request that uses
    it). An append out of sequence (``seq``: appends lost, e.g. the stage restarted while the stream was going)
    fails the stream rather than give the thinker a clip with a hole."""

    def __init__(self, new_stream: Callable[[], StreamingAudioInput], run: Callable[[Callable[[], None]], None],
                 max_streams: int = MAX_OPEN_STREAMS, max_seconds: float = MAX_STREAM_S) -> None:
        self._new_stream = new_stream
        self._run = run
        self.max_streams = max_streams
        self.max_seconds = max_seconds
        self._open: dict[str, _OpenStream] = {}
        self._claimed: dict[str, tuple[str, _OpenStream | None]] = {}  # request id -> (stream id, its stream)

    def __len__(self) -> int:
        return len(self._open)

    def append(self, stream_id: str, session_id: str | None, seq: int, pcm: np.ndarray) -> None:
        entry = self._open.get(stream_id)
        if entry is None:
            while len(self._open) >= self.max_streams:
                oldest = min(self._open, key=lambda key: self._open[key].used_at)
                logger.warning("audio stream %s dropped: %d streams are open (the most a stage keeps)", oldest,
                               len(self._open))
                del self._open[oldest]
            entry = self._open[stream_id] = _OpenStream(None, session_id)
            if seq != 0:
                entry.error = (f"stream {stream_id!r} lost its first {seq} append(s) (the stage restarted while it "
                               "streamed)")
                return
            entry.stream = self._new_stream()
        entry.used_at = time.monotonic()
        if entry.error is not None:
            return
        if seq != entry.next_seq:
            self._fail(entry, f"stream {stream_id!r} lost appends {entry.next_seq} to {seq - 1} (the stage "
                              "restarted while it streamed)")
            return
        entry.next_seq += 1
        entry.samples += len(pcm)
        if entry.samples > self.max_seconds * SAMPLE_RATE_HZ:
            self._fail(entry, f"stream {stream_id!r} is longer than {self.max_seconds:g} s")
            return
        stream = entry.stream  # None if the processing thread failed it meanwhile
        if stream is None:
            return

        def work() -> None:
            if entry.error is not None:
                return
            try:
                stream.append(pcm)
            except Exception as exc:  # noqa: BLE001 - the request that uses the stream fails with it
                logger.exception("audio stream %s: an append failed", stream_id)
                self._fail(entry, f"stream {stream_id!r} could not be processed: {exc}")

        self._run(work)

    def drop(self, stream_id: str) -> None:
        self._open.pop(stream_id, None)

    def end_session(self, session_id: str) -> None:
        for stream_id in [key for key, entry in self._open.items() if entry.session_id == session_id]:
            del self._open[stream_id]

    def claim(self, request_id: str, item: dict[str, Any]) -> None:
        """A request was admitted: if its audio is a stream, it takes it out of the map (known or not)."""
        stream_id = stream_reference(item.get("audios"))
        if stream_id is not None:
            self._claimed[request_id] = (stream_id, self._open.pop(stream_id, None))

    def resolve(self, request_id: str, item: dict[str, Any]) -> dict[str, Any]:
        """The request's item with its stream finished as its only audio (on the processing thread); FieldError
        naming the audio for a stream unknown here or one that failed."""
        if stream_reference(item.get("audios")) is None:
            return item
        stream_id, entry = self._claimed.pop(request_id, (stream_reference(item.get("audios")), None))
        if entry is None:
            raise FieldError(AUDIO_FIELD, f"stream {stream_id!r} is unknown: never appended to, dropped, or the "
                                          "stage restarted")
        if entry.error is not None or entry.stream is None:
            raise FieldError(AUDIO_FIELD, entry.error or f"stream {stream_id!r} failed")
        try:
            streamed = entry.stream.finish()
        except ValueError as exc:
            raise FieldError(AUDIO_FIELD, f"stream {stream_id!r}: {exc}") from None
        return {**item, "audios": [streamed]}

    def release(self, request_id: str) -> None:
        """The request left the stage: what it claimed goes."""
        self._claimed.pop(request_id, None)

    @staticmethod
    def _fail(entry: _OpenStream, error: str) -> None:
        entry.error, entry.stream = error, None


class AudioStreamRunner(StageRunner):
    """The audio-stream hooks of a runner that keeps its streams in ``audio_streams`` (an ``AudioStreams`` it makes
    at load), with this module's limits: appends and drops go to it, and a session's end drops its streams first."""

    max_audio_streams = MAX_OPEN_STREAMS
    max_audio_stream_s = MAX_STREAM_S
    audio_streams: AudioStreams

    def append_audio(self, stream_id: str, session_id: str | None, pcm16k: np.ndarray, seq: int) -> None:
        self.audio_streams.append(stream_id, session_id, seq, pcm16k)

    def drop_audio_stream(self, stream_id: str) -> None:
        self.audio_streams.drop(stream_id)

    def end_session(self, session_id: str) -> None:
        self.audio_streams.end_session(session_id)
        super().end_session(session_id)
