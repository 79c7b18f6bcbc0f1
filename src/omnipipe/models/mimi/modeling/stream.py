"""Exact streaming through transformers' ``MimiModel`` (24 kHz, 12.5 Hz frames of 1920 samples): a per-request
decoder whose concatenated outputs equal one ``MimiModel.decode`` of all the codes, and a per-request encoder
whose codes equal one ``MimiModel.encode`` of all the samples.

Why the decoder needs its own scheme: ``MimiModel.decode`` keeps no convolution state (its
``decoder_past_key_values`` covers only the transformer), so decoding chunk by chunk through it restarts every
convolution from zero padding (differences of order 1 at each seam). And a window of earlier frames re-decoded
with each chunk would need ``layers * (sliding_window - 1)`` transformer steps of context (about 80 s of audio
for the released Mimi). The decode is causal with no tail (``n`` frames give ``n * 1920`` samples, each reading
only frames up to its own), so a stream keeps, per request:

- the last latent frame(s) the upsampling reads before a chunk's first (1 for the released kernel 4, stride 2);
- the decoder transformer's KV cache (a sliding-window ``DynamicCache``), stepped with explicit rope positions;
- the last transformer outputs the SEANet decoder reads before a chunk's first sample (8 steps for the released
  kernels), run again ahead of each chunk's outputs, whose samples are then dropped.

The two contexts are read from the modules (``mimi_decode_geometry``), not assumed. Float32 results match the
whole decode to rounding (within 2e-6 of absmax; convolutions take other algorithms at other lengths), not bit for
bit. The encoder streams with transformers' own state (``use_streaming=True``: each convolution's padding cache
and the encoder transformer's KV cache) over whole 1920-sample frames; its codes are bit-equal to a whole encode.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from omnipipe.util.field_error import FieldError

if TYPE_CHECKING:
    from transformers import DynamicCache, MimiModel
    from transformers.models.mimi.modeling_mimi import MimiConv1dPaddingCache


@dataclass(frozen=True)
class MimiDecodeGeometry:
    """How one ``MimiModel``'s decoder maps code frames to samples, read from its modules."""

    steps_per_frame: int  # transformer steps per code frame (the upsampling's stride, ``latent_stride``: 2)
    samples_per_step: int  # SEANet samples per transformer step (the product of ``upsampling_ratios``: 960)
    upsample_context_frames: int  # latent frames before a chunk that its first steps read (1)
    seanet_context_steps: int  # transformer outputs before a chunk that its first samples read (8)

    @property
    def samples_per_frame(self) -> int:
        return self.steps_per_frame * self.samples_per_step


def _conv_span(layer: nn.Module, low: int, high: int) -> tuple[int, int]:
    """The input positions the output positions ``[low, high]`` of one decoder layer read (its own rate in, its
    own rate out; positions before 0 are the zero padding of a decode's start)."""
    from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

    if isinstance(layer, MimiConv1d):
        if not layer.causal:
            raise ValueError("mimi: a non-causal convolution reads samples ahead; a stream would need lookahead")
        stride, dilation, kernel = layer.conv.stride[0], layer.conv.dilation[0], layer.conv.kernel_size[0]
        padding = dilation * (kernel - 1) + 1 - stride  # ``padding_total``, all on the left (causal)
        # output o reads the padded inputs o * stride + dilation * [0, kernel - 1]
        return low * stride - padding, high * stride - padding + dilation * (kernel - 1)
    if isinstance(layer, MimiConvTranspose1d):
        conv = layer.conv
        if conv.padding != (0,) or conv.dilation != (1,) or conv.output_padding != (0,):
            raise ValueError(f"mimi: unexpected padding, dilation or output_padding in {conv}")
        stride, kernel = conv.stride[0], conv.kernel_size[0]
        # trimmed output o is untrimmed j = o + padding_left, which input i reaches when i*s <= j <= i*s + k - 1
        first, last = low + layer.padding_left, high + layer.padding_left
        return math.ceil((first - kernel + 1) / stride), last // stride
    if isinstance(layer, MimiResnetBlock):
        block = _sequence_span(list(layer.block), low, high)
        shortcut = _conv_span(layer.shortcut, low, high)
        return min(block[0], shortcut[0]), max(block[1], shortcut[1])
    if isinstance(layer, (nn.ELU, nn.Identity)):  # pointwise
        return low, high
    raise ValueError(f"mimi: no streaming rule for a decoder layer of type {type(layer).__name__}")


def _sequence_span(layers: list[nn.Module], low: int, high: int) -> tuple[int, int]:
    for layer in reversed(layers):
        low, high = _conv_span(layer, low, high)
    return low, high


def mimi_decode_geometry(model: MimiModel) -> MimiDecodeGeometry:
    """The decoder's geometry, from its upsampling and SEANet modules: strides, kernels, dilations, trims.
    Raises ``ValueError`` for a decoder that reads ahead of the samples it makes (no exact stream without
    lookahead) or whose lengths are not a whole number of samples per frame."""
    from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d

    decoder = model.decoder
    if decoder is None:
        raise ValueError("mimi: the model was loaded without its decoder")
    if model.config.audio_channels != 1:
        raise ValueError(f"mimi: a stream is mono; the model has {model.config.audio_channels} audio channels")
    far = 1 << 12  # a step far from the start: the map from outputs to inputs repeats every step
    upsample = decoder.upsample
    if upsample is None:
        steps_per_frame, upsample_context = 1, 0
    else:
        steps_per_frame = upsample.conv.stride[0]
        low, high = _conv_span(upsample, far * steps_per_frame, (far + 1) * steps_per_frame - 1)
        if high > far:
            raise ValueError("mimi: the upsampling reads frames past the steps it makes")
        upsample_context = far - low
    layers = list(decoder.decoder_seanet.layers)
    samples_per_step = 1
    for layer in (m for m in decoder.decoder_seanet.modules() if isinstance(m, (MimiConv1d, MimiConvTranspose1d))):
        if isinstance(layer, MimiConv1d) and layer.conv.stride[0] != 1:
            raise ValueError(f"mimi: a strided convolution in the SEANet decoder ({layer.conv})")
        if isinstance(layer, MimiConvTranspose1d):  # n inputs give n * stride outputs (kernel - stride trimmed)
            samples_per_step *= layer.conv.stride[0]
    low, high = _sequence_span(layers, far * samples_per_step, (far + 1) * samples_per_step - 1)
    if high > far:
        raise ValueError("mimi: the SEANet decoder reads steps past the samples it makes")
    geometry = MimiDecodeGeometry(steps_per_frame, samples_per_step, upsample_context, far - low)
    if geometry.samples_per_frame != model.config.frame_size:
        raise ValueError(f"mimi: the decoder makes {geometry.samples_per_frame} samples a frame, the config says "
                         f"frame_size {model.config.frame_size}")
    return geometry


def check_codes(codes: Any, config: Any, num_codebooks: int, field: str = "codes") -> torch.Tensor:
    """``codes`` as a [num_codebooks, frames] int64 tensor (a copy of an array: relayed arrays are read-only), or
    a ``FieldError`` naming ``field``: not 2-D, another number of codebooks, not integers, a code outside
    ``[0, codebook_size)`` (checked on the host side before any lookup: an out-of-range index on a GPU would be a
    device assert)."""
    if isinstance(codes, np.ndarray):
        if not np.issubdtype(codes.dtype, np.integer):
            raise FieldError(field, f"must hold integer codes, got {codes.dtype}")
        codes = torch.from_numpy(np.array(codes, dtype=np.int64))
    if not isinstance(codes, torch.Tensor) or codes.ndim != 2:
        raise FieldError(field, f"must be a [num_codebooks, frames] array of codes, got "
                         f"{getattr(codes, 'shape', type(codes).__name__)!r}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise FieldError(field, f"must hold integer codes, got {codes.dtype}")
    if codes.shape[0] != num_codebooks:
        raise FieldError(field, f"must have {num_codebooks} codebooks per frame, got {codes.shape[0]}")
    if codes.numel():
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= config.codebook_size:
            raise FieldError(field, f"code {low if low < 0 else high} is outside Mimi's codebook "
                             f"[0, {config.codebook_size})")
    return codes.to(torch.int64)


def _checked_num_codebooks(config: Any, num_codebooks: int | None) -> int:
    count = config.num_quantizers if num_codebooks is None else num_codebooks
    if isinstance(count, bool) or not isinstance(count, int) \
            or not config.num_semantic_quantizers <= count <= config.num_quantizers:
        raise FieldError("num_codebooks", f"must be an integer in [{config.num_semantic_quantizers}, "
                         f"{config.num_quantizers}] (Mimi's quantizers), got {count!r}")
    return count


def _copy_cache(cache: DynamicCache) -> DynamicCache:
    """A cache that a forward can advance while ``cache`` stays as it is: its layers copied shallowly (a layer's
    ``update`` binds new tensors, ``torch.cat`` of the old and the new; it never writes into the old ones)."""
    copied = copy.copy(cache)
    copied.layers = [copy.copy(layer) for layer in cache.layers]
    return copied


@dataclass(frozen=True)
class _DecodeState:
    frames: int  # code frames decoded so far
    latents: torch.Tensor | None  # [1, hidden, <= upsample_context_frames]: the last latent frames
    cache: DynamicCache  # the decoder transformer's (sliding-window) KV cache
    history: torch.Tensor | None  # [1, hidden, <= seanet_context_steps]: the last transformer outputs


class MimiDecodeStream:
    """One request's decode: ``decode(codes)`` with the next [num_codebooks, n] frames returns their n * 1920
    samples (1-D, the model's dtype and device); the outputs, concatenated, equal ``model.decode`` of all the
    frames (float32: within 2e-6 of absmax). A stream is small: the KV cache of one sliding window, one latent
    frame and the SEANet's context steps. ``snapshot()``/``restore()`` put it back as it was (a decode binds a new
    state; it never changes the old one), for a stage that retries a failed step."""

    def __init__(self, model: MimiModel, num_codebooks: int | None = None,
                 geometry: MimiDecodeGeometry | None = None) -> None:
        from transformers import DynamicCache

        self.model = model
        self.geometry = geometry or mimi_decode_geometry(model)
        self.num_codebooks = _checked_num_codebooks(model.config, num_codebooks)
        assert model.decoder is not None  # mimi_decode_geometry refuses a model without one
        self._transformer = model.decoder.decoder_transformer
        self._state = _DecodeState(0, None, DynamicCache(config=self._transformer.config), None)

    @property
    def frames_decoded(self) -> int:
        return self._state.frames

    def snapshot(self) -> object:
        """The stream's state now, for ``restore``."""
        return self._state

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, _DecodeState)
        self._state = snapshot

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The samples of the next frames ``codes`` ([num_codebooks, n] integers in ``[0, codebook_size)``; a
        ``FieldError`` naming ``codes`` otherwise)."""
        model, geometry, state = self.model, self.geometry, self._state
        checked = check_codes(codes, model.config, self.num_codebooks)
        decoder = model.decoder
        assert decoder is not None
        parameter = next(decoder.parameters())
        count = checked.shape[1]
        if count == 0:
            return torch.zeros(0, dtype=parameter.dtype, device=parameter.device)
        latents = model.quantizer.decode(checked.to(parameter.device)[None]).to(parameter.dtype)  # per frame
        if decoder.upsample is None:
            steps, tail = latents, None
        else:
            context = 0 if state.latents is None else state.latents.shape[-1]
            inputs = latents if state.latents is None else torch.cat([state.latents, latents], -1)
            steps = decoder.upsample(inputs)[..., context * geometry.steps_per_frame:]
            keep = geometry.upsample_context_frames
            tail = inputs[..., inputs.shape[-1] - min(keep, inputs.shape[-1]):] if keep else None
        cache = _copy_cache(state.cache)
        first = state.frames * geometry.steps_per_frame
        positions = torch.arange(first, first + steps.shape[-1], device=steps.device)[None]
        hidden = self._transformer(steps.transpose(1, 2), past_key_values=cache, use_cache=True,
                                   position_ids=positions).last_hidden_state.transpose(1, 2)
        window = hidden if state.history is None else torch.cat([state.history, hidden], -1)
        wave = decoder.decoder_seanet(window)[0, 0, (window.shape[-1] - hidden.shape[-1]) * geometry.samples_per_step:]
        keep = geometry.seanet_context_steps
        history = window[..., window.shape[-1] - min(keep, window.shape[-1]):] if keep else None
        self._state = _DecodeState(state.frames + count, tail, cache, history)
        return wave


class MimiEncodeStream:
    """One request's encode: ``encode(samples)`` takes any number of 24 kHz mono samples and returns the codes
    ([num_codebooks, k] int64, the model's device) of the k whole 1920-sample frames they complete, the rest kept
    for the next call. The codes, concatenated, equal ``model.encode`` of all the samples when they are whole
    frames, bit for bit (transformers' streaming encode: each causal convolution's padding cache and the encoder
    transformer's KV cache). ``flush()`` encodes what is left padded with zeros to a whole frame: the codes of
    ``model.encode`` of the clip padded so."""

    def __init__(self, model: MimiModel, num_codebooks: int | None = None) -> None:
        if model.encoder is None:
            raise ValueError("mimi: the model was loaded without its encoder")
        self.model = model
        self.num_codebooks = _checked_num_codebooks(model.config, num_codebooks)
        self.frame_samples = int(model.config.frame_size)
        parameter = next(model.encoder.parameters())
        self._device, self._dtype = parameter.device, parameter.dtype
        self._pending = torch.zeros(0, dtype=torch.float32)
        self._padding_cache: MimiConv1dPaddingCache | None = None
        self._past: DynamicCache | None = None
        self.frames_encoded = 0

    @property
    def pending_samples(self) -> int:
        """Samples received but not yet encoded (less than a frame)."""
        return int(self._pending.shape[0])

    @torch.inference_mode()
    def encode(self, samples: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The codes of the whole frames that ``samples`` (1-D float) complete."""
        if isinstance(samples, np.ndarray):
            samples = torch.from_numpy(np.array(samples, dtype=np.float32))
        if not isinstance(samples, torch.Tensor) or samples.ndim != 1 or not samples.dtype.is_floating_point:
            raise FieldError("samples", f"must be 1-D float audio (24 kHz mono), got "
                             f"{getattr(samples, 'shape', type(samples).__name__)!r}")
        self._pending = torch.cat([self._pending, samples.detach().to("cpu", torch.float32)])
        frames = self.pending_samples // self.frame_samples
        if frames == 0:
            return torch.zeros((self.num_codebooks, 0), dtype=torch.int64, device=self._device)
        whole, self._pending = (self._pending[: frames * self.frame_samples],
                                self._pending[frames * self.frame_samples:])
        values = whole.to(self._device, self._dtype)[None, None]
        out = self.model.encode(values, num_quantizers=self.num_codebooks, use_streaming=True,
                                padding_cache=self._padding_cache, encoder_past_key_values=self._past)
        self._padding_cache, self._past = out.padding_cache, out.encoder_past_key_values
        self.frames_encoded += frames
        assert out.audio_codes is not None
        return out.audio_codes[0]

    def flush(self) -> torch.Tensor:
        """The codes of the samples left, padded with zeros to a whole frame ([num_codebooks, 0 or 1])."""
        if self.pending_samples == 0:
            return torch.zeros((self.num_codebooks, 0), dtype=torch.int64, device=self._device)
        return self.encode(torch.zeros(self.frame_samples - self.pending_samples))
