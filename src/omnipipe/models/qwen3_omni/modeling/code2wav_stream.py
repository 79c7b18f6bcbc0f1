"""Exact streaming decode for Qwen3-Omni's vocoder (``Qwen3OmniMoeCode2Wav``): windows of codes with left
context whose outputs, concatenated, equal one whole decode of all the codes.

How the vocoder maps frames to samples (read from the module, see ``code2wav_geometry``):

- A sliding-window causal transformer over code frames: frame t sees frames ``[t - (W - 1), t]`` in each of its L
  layers, so ``L * (W - 1)`` frames back in all.
- Upsampling and a decoder of causal convolutions (they look back only) and causal transposed convolutions.
  A transposed convolution of stride r and kernel 2r trims r samples at each end, so it returns ``(n - 1) * r``
  samples for n inputs: every sample it keeps is complete (it never reads past the last input), and the decode of
  n frames is ``n * samples_per_frame - tail_samples`` long.

So a decode of frames ``[a, e)`` gives the whole decode's samples ``[a * U, e * U - tail)`` (U samples per frame),
exactly for every sample whose dependencies start at frame a or later: a window must carry
``exact_left_context_frames`` frames before its new ones. Stream position of a frame boundary b is
``b * U - tail`` (0 for b = 0), and the window whose new frames are ``[s, e)`` emits ``[pos(s), pos(e))``: its
new frames' samples less the last ``tail`` ones, plus the ``tail`` samples the previous window could not make.
The last window ends where the whole decode ends (``pos(T)`` is the whole decode's length), so it needs no flag.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

from omnipipe.util.field_error import FieldError

_ConvLayer = Qwen3OmniMoeCausalConvNet | Qwen3OmniMoeCausalTransConvNet  # what the vocoder's convolutions are


@dataclass(frozen=True)
class Code2WavGeometry:
    """How one ``Qwen3OmniMoeCode2Wav`` maps code frames to samples."""

    samples_per_frame: int  # U: the product of every upsampling stride
    tail_samples: int  # a decode of n frames is n * U - tail_samples long; the next window makes those samples
    transformer_context_frames: int  # frames back the transformer reaches: layers * (sliding_window - 1)
    exact_left_context_frames: int  # context that makes a window's emitted samples equal the whole decode's

    def stream_position(self, frame_boundary: int) -> int:
        """The sample of the stream at which the audio of the frames from ``frame_boundary`` on begins."""
        return 0 if frame_boundary == 0 else frame_boundary * self.samples_per_frame - self.tail_samples


def _conv_layers(code2wav: Qwen3OmniMoeCode2Wav) -> list[_ConvLayer]:
    """The causal (transposed) convolutions after the transformer, in the order the forward applies them."""
    layers = [m for part in (code2wav.upsample, code2wav.decoder) for m in part.modules()
              if isinstance(m, (Qwen3OmniMoeCausalConvNet, Qwen3OmniMoeCausalTransConvNet))]
    for layer in layers:
        conv = layer.conv
        if conv.padding != (0,):
            raise ValueError(f"code2wav: unexpected built-in padding in {conv}")
        if isinstance(layer, Qwen3OmniMoeCausalTransConvNet) and (conv.dilation != (1,) or conv.output_padding != (0,)):
            raise ValueError(f"code2wav: unexpected dilation or output_padding in {conv}")
    return layers


def _input_span(layers: list[_ConvLayer], first_sample: int, last_sample: int) -> tuple[int, int]:
    """The input positions (frames of the transformer's output) the output samples ``[first, last]`` read."""
    low, high = first_sample, last_sample
    for layer in reversed(layers):
        if isinstance(layer, Qwen3OmniMoeCausalConvNet):
            # output o reads padded inputs [o*s, o*s + K - 1], i.e. unpadded [o*s - padding, o*s - padding + K - 1]
            stride, kernel, padding = layer.stride, layer.kernel_size, layer.padding
            low, high = low * stride - padding, high * stride - padding + kernel - 1
        else:
            # trimmed output o is untrimmed j = o + left_pad, which input i reaches when i*s <= j <= i*s + k - 1
            stride, kernel, left = layer.conv.stride[0], layer.conv.kernel_size[0], layer.left_pad
            low, high = math.ceil((low + left - kernel + 1) / stride), (high + left) // stride
    return low, high


def _output_length(layers: list[_ConvLayer], frames: int) -> int:
    """Samples the convolutions make of ``frames`` transformer outputs."""
    length = frames
    for layer in layers:
        if isinstance(layer, Qwen3OmniMoeCausalConvNet):
            # the right padding rounds up to whole strides
            length = math.ceil((length - layer.kernel_size + layer.padding) / layer.stride) + 1
        else:
            conv = layer.conv
            length = (length - 1) * conv.stride[0] + conv.kernel_size[0] - layer.left_pad - layer.right_pad
    return length


def code2wav_geometry(code2wav: Qwen3OmniMoeCode2Wav) -> Code2WavGeometry:
    """Read the geometry from the module: its config (layers, sliding window) and its convolutions' kernels,
    dilations, strides and trims."""
    config = code2wav.config
    if any(kind != "sliding_attention" for kind in config.layer_types) or not config.sliding_window:
        raise ValueError("code2wav: a transformer layer without a sliding window sees every earlier frame; no "
                         "finite left context makes a window exact")
    transformer_context = config.num_hidden_layers * (config.sliding_window - 1)
    layers = _conv_layers(code2wav)
    samples_per_frame = 1
    for layer in layers:
        samples_per_frame *= layer.stride if isinstance(layer, Qwen3OmniMoeCausalConvNet) else layer.conv.stride[0]
    if samples_per_frame != int(code2wav.total_upsample):
        raise ValueError(f"code2wav: the convolutions' strides multiply to {samples_per_frame}, the module says "
                         f"total_upsample {int(code2wav.total_upsample)}")
    # far from the start, where the zero padding at frame 0 plays no part; the map repeats every frame
    far = 4 * (transformer_context + len(layers) + 8)
    tail = far * samples_per_frame - _output_length(layers, far)
    if tail != (far + 1) * samples_per_frame - _output_length(layers, far + 1) or not 0 <= tail < samples_per_frame:
        raise ValueError(f"code2wav: the decode's length is not frames * {samples_per_frame} less a constant "
                         f"tail in [0, {samples_per_frame})")
    # the last sample of a decode ending at frame `far` must read no frame past it
    _, reads_up_to = _input_span(layers, far * samples_per_frame - tail - 1, far * samples_per_frame - tail - 1)
    if reads_up_to > far - 1:
        raise ValueError("code2wav: the decode's last samples read frames past the end (right padding); windows "
                         "would need lookahead frames")
    first_emitted = far * samples_per_frame - tail  # the first sample a window with new frames from `far` emits
    conv_first_frame, _ = _input_span(layers, first_emitted, first_emitted)
    exact = far - (conv_first_frame - transformer_context)
    return Code2WavGeometry(samples_per_frame, tail, transformer_context, exact)


def exact_left_context_frames(code2wav: Qwen3OmniMoeCode2Wav) -> int:
    """The left context (code frames) that makes a windowed decode equal the whole decode: the transformer's
    ``layers * (sliding_window - 1)`` plus the frames the convolutions reach back from a window's first sample."""
    return code2wav_geometry(code2wav).exact_left_context_frames


@dataclass(frozen=True)
class CodeWindow:
    """One window of one request: ``frames`` [Q, context_frames + new frames] integer codes, the first
    ``context_frames`` of them already decoded by earlier windows; ``start_frame`` the absolute index of the
    first new frame (0 for the first window, which has no context)."""

    frames: torch.Tensor
    context_frames: int
    start_frame: int

    @classmethod
    def from_chunk(cls, chunk: Mapping[str, Any]) -> CodeWindow:
        """A window from a frame-edge chunk dict (``frames`` [Q, context + new + lookahead] codes,
        ``context_frames``, ``start_frame``, ``lookahead_frames``). Lookahead frames are dropped: this vocoder
        reads no frame past a sample it makes, so the next window decodes them."""
        for name in ("frames", "context_frames", "start_frame"):
            if name not in chunk:
                raise FieldError(name, "missing from the chunk")
        frames = chunk["frames"]
        if isinstance(frames, np.ndarray):  # a copy: relayed arrays are read-only
            frames = torch.from_numpy(np.array(frames))
        if not isinstance(frames, torch.Tensor) or frames.ndim != 2:
            raise FieldError("frames", f"must be a [Q, T] array of codes, got {getattr(frames, 'shape', frames)!r}")
        lookahead = _whole_number("lookahead_frames", chunk.get("lookahead_frames", 0))
        if lookahead > frames.shape[1]:
            raise FieldError("lookahead_frames", f"{lookahead} is more than the chunk's {frames.shape[1]} frames")
        if lookahead:
            frames = frames[:, : frames.shape[1] - lookahead]
        return cls(frames, _whole_number("context_frames", chunk["context_frames"]),
                   _whole_number("start_frame", chunk["start_frame"]))


def _whole_number(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise FieldError(field, f"must be an integer >= 0, got {value!r}")
    return int(value)


def _check_window(window: CodeWindow, geometry: Code2WavGeometry, config: Any, where: str) -> None:
    frames = window.frames
    if frames.ndim != 2 or frames.shape[0] != config.num_quantizers:
        raise FieldError(f"{where}frames", f"must be [num_quantizers={config.num_quantizers}, T], got "
                         f"{tuple(frames.shape)}")
    if frames.dtype.is_floating_point or frames.dtype.is_complex or frames.dtype == torch.bool:
        raise FieldError(f"{where}frames", f"must hold integer codes, got {frames.dtype}")
    if frames.numel() and not 0 <= int(frames.min()) <= int(frames.max()) < config.codebook_size:
        raise FieldError(f"{where}frames", f"codes must lie in [0, codebook_size={config.codebook_size}), got "
                         f"[{int(frames.min())}, {int(frames.max())}]")
    context, start = window.context_frames, window.start_frame
    if context > frames.shape[1]:
        raise FieldError(f"{where}context_frames", f"{context} is more than the window's {frames.shape[1]} frames")
    if context > start:
        raise FieldError(f"{where}context_frames", f"{context} frames before start_frame {start} do not exist")
    if start > 0 and context * geometry.samples_per_frame < geometry.tail_samples:
        raise FieldError(f"{where}context_frames", f"a window after the first needs at least "
                         f"{math.ceil(geometry.tail_samples / geometry.samples_per_frame)} context frame(s) to "
                         f"make the {geometry.tail_samples} samples the previous window could not, got {context}")


def _emitted_range(window: CodeWindow, geometry: Code2WavGeometry) -> tuple[int, int]:
    """The window's samples to emit, as [first, end) positions in its own decode."""
    window_start = window.start_frame - window.context_frames
    window_end = window_start + window.frames.shape[1]
    offset = window_start * geometry.samples_per_frame  # the stream position of the window decode's sample 0
    return geometry.stream_position(window.start_frame) - offset, geometry.stream_position(window_end) - offset


def _decode_at_positions(code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor,
                         positions: torch.Tensor) -> torch.Tensor:
    """``code2wav(codes)`` with the transformer's rotary positions set to the frames' absolute indices (the
    module's own forward numbers every window from 0): the rotary angles, computed in float32, are then the very
    ones of the whole decode, not ones equal only up to rounding."""

    def set_positions(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, "position_ids": positions}

    handle = code2wav.pre_transformer.register_forward_pre_hook(set_positions, with_kwargs=True)
    try:
        return code2wav(codes)
    finally:
        handle.remove()


@torch.inference_mode()
def decode_windows(code2wav: Qwen3OmniMoeCode2Wav, windows: Sequence[CodeWindow]) -> list[torch.Tensor]:
    """Decode several requests' windows in one call; return, per window, the 1-D samples its new frames add to
    that request's stream (float, the module's dtype).

    A stage runner calls it per step with one window per chunk (``CodeWindow.from_chunk(chunk)``: the chunk's
    ``frames`` [Q, T] codes, ``context_frames`` and ``start_frame`` are all it needs), the frame edge set to
    ``left_context_frames = exact_left_context_frames(code2wav)`` and no right context. Concatenating
    a request's outputs in order equals ``code2wav(all its codes)`` once every window carries at least
    ``exact_left_context_frames(code2wav)`` context frames (or all frames before it); fewer make an approximation.
    The last window needs no flag: its output ends where the whole decode does. Windows of different lengths are
    right-padded with code 0 into one batch: the decode is causal and reads no frame past a kept sample, so the
    padding changes none of the samples returned.
    """
    if not windows:
        return []
    geometry = code2wav_geometry(code2wav)
    quantizers = code2wav.config.num_quantizers
    for i, window in enumerate(windows):
        _check_window(window, geometry, code2wav.config, f"windows[{i}]." if len(windows) > 1 else "")
    longest = max(window.frames.shape[1] for window in windows)
    device = code2wav.code_offset.device
    codes = torch.zeros((len(windows), quantizers, longest), dtype=torch.long, device=device)
    for i, window in enumerate(windows):
        codes[i, :, : window.frames.shape[1]] = window.frames.to(device=device, dtype=torch.long)
    if longest == 0:
        return [torch.zeros(0, device=device) for _ in windows]
    window_starts = torch.tensor([w.start_frame - w.context_frames for w in windows], device=device)
    positions = window_starts[:, None] + torch.arange(longest, device=device)
    waves = _decode_at_positions(code2wav, codes, positions)[:, 0]
    out = []
    for window, wave in zip(windows, waves, strict=True):
        first, end = _emitted_range(window, geometry)
        out.append(wave[first:end])
    return out


def decode_window(code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor, context_frames: int,
                  start_frame: int) -> torch.Tensor:
    """Decode same-shaped windows ``codes`` [B, Q, context_frames + new] whose new frames begin at absolute
    frame ``start_frame``; return [B, samples]: what the new frames add to each stream (see ``decode_windows``)."""
    if codes.ndim != 3:
        raise FieldError("codes", f"must be [B, Q, T], got {tuple(codes.shape)}")
    context = _whole_number("context_frames", context_frames)
    start = _whole_number("start_frame", start_frame)
    return torch.stack(decode_windows(code2wav, [CodeWindow(row, context, start) for row in codes]))
