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
- the SEANet decoder's convolution state (``_SeanetState``): each causal convolution's last ``dilation *
  (kernel - 1)`` inputs, and each transposed convolution's overlap tail (its last ``kernel - stride`` untrimmed
  outputs, before bias, that the next inputs add to). A chunk then runs the SEANet over its own steps only; a
  stream that re-ran the ``seanet_context_steps`` (8) steps of context before each chunk did about 5x the work
  for 1-frame chunks.

``decode_together`` decodes several streams' chunks in one step: the upsampling and the SEANet batched over the
rows with equal chunk lengths (their states stacked), the transformer row by row (each its own positions and
sliding-window cache). The geometry (``mimi_decode_geometry``) is read from the modules, not assumed: it refuses a
decoder that reads ahead, and says how far back the carried state reaches. Float32 results match the whole decode
to rounding (within 2e-6 of absmax; convolutions take other algorithms at other lengths), not bit for bit. The
encoder streams with transformers' own state (``use_streaming=True``: each convolution's padding cache and the
encoder transformer's KV cache) over whole 1920-sample frames; its codes are bit-equal to a whole encode.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

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
    # transformer outputs before a chunk that its first samples read (8): how far back the SEANet state reaches
    seanet_context_steps: int

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


_SeanetState = tuple[torch.Tensor, ...]  # one tensor [rows, channels, width] per stateful layer, in running order


def _stateful_layers(seanet: Any) -> list[nn.Module]:
    """The SEANet decoder's convolutions in the order a forward runs them (each residual block's own convolutions,
    then its shortcut); ``ValueError`` for a layer a stream cannot carry exactly: a non-causal or strided
    convolution, padding other than zeros, a transposed convolution that trims on the left (it would read ahead)."""
    from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

    found: list[nn.Module] = []

    def visit(layer: nn.Module) -> None:
        if isinstance(layer, MimiConv1d):
            if not layer.causal or layer.conv.stride[0] != 1 or layer.conv.padding != (0,):
                raise ValueError(f"mimi: a SEANet convolution a stream cannot carry: {layer.conv}")
            if layer.pad_mode != "constant":
                raise ValueError(f"mimi: pad_mode {layer.pad_mode!r}; a stream carries zero padding only")
            found.append(layer)
        elif isinstance(layer, MimiConvTranspose1d):
            if layer.padding_left != 0:
                raise ValueError(f"mimi: a transposed convolution trims {layer.padding_left} samples on the left")
            found.append(layer)
        elif isinstance(layer, MimiResnetBlock):
            for inner in layer.block:
                visit(inner)
            visit(layer.shortcut)
        elif not isinstance(layer, (nn.ELU, nn.Identity)):
            raise ValueError(f"mimi: no streaming rule for a decoder layer of type {type(layer).__name__}")

    for layer in seanet.layers:
        visit(layer)
    return found


def seanet_state_widths(model: MimiModel) -> tuple[int, ...]:
    """The width of the state a stream carries for each stateful SEANet layer, in running order: a causal
    convolution's ``dilation * (kernel - 1)`` last inputs (0 for a 1x1 one), a transposed convolution's ``kernel -
    stride`` overlap tail."""

    assert model.decoder is not None
    convs = [_conv_of(layer) for layer in _stateful_layers(model.decoder.decoder_seanet)]
    return tuple(conv.dilation[0] * (conv.kernel_size[0] - 1) if isinstance(conv, nn.Conv1d)
                 else conv.kernel_size[0] - conv.stride[0] for conv in convs)


def _conv_of(layer: nn.Module) -> nn.Conv1d | nn.ConvTranspose1d:
    conv = layer.conv
    assert isinstance(conv, (nn.Conv1d, nn.ConvTranspose1d))
    return conv


def _initial_seanet_state(model: MimiModel) -> _SeanetState:
    """The state at a stream's start: zeros (the whole decode's zero padding; no transposed output before)."""
    assert model.decoder is not None
    parameter = next(model.decoder.parameters())
    states = []
    for layer, width in zip(_stateful_layers(model.decoder.decoder_seanet), seanet_state_widths(model), strict=True):
        conv = _conv_of(layer)
        channels = conv.in_channels if isinstance(conv, nn.Conv1d) else conv.out_channels
        states.append(torch.zeros((1, channels, width), dtype=parameter.dtype, device=parameter.device))
    return tuple(states)


_FEW_INPUTS = 12  # at most this many inputs, a transposed convolution runs as one matmul and an overlap-add


def _conv_transpose(x: torch.Tensor, conv: nn.ConvTranspose1d) -> torch.Tensor:
    """``conv`` over ``x`` [rows, in, n] untrimmed and without bias ([rows, out, (n - 1) * stride + kernel]). For a
    few inputs (a 1-frame chunk's 2 steps), as one matmul and an overlap-add: torch's CPU transposed convolution
    takes a slow path there (about 45 ms for the released first SEANet upsampling, 1024 -> 512 channels, kernel 16,
    against 3 ms)."""
    if conv.groups != 1 or x.shape[-1] > _FEW_INPUTS:
        return functional.conv_transpose1d(x, conv.weight, None, conv.stride, groups=conv.groups)
    weight, stride = conv.weight, conv.stride[0]
    inputs, outputs, kernel = weight.shape
    parts = -(-kernel // stride)  # the kernel in stride-long parts, the last zero-padded
    if parts * stride != kernel:
        weight = functional.pad(weight, (0, parts * stride - kernel))
    rows, _, n = x.shape
    # every input's kernel-long contribution, part q of input i landing at (i + q) * stride
    made = (x.transpose(1, 2) @ weight.reshape(inputs, outputs * parts * stride)).view(rows, n, outputs, parts, stride)
    made = made.permute(0, 2, 3, 1, 4).reshape(rows, outputs, parts, n * stride)
    full = made.new_zeros((rows, outputs, (n - 1 + parts) * stride))
    for part in range(parts):
        full[..., part * stride: (part + n) * stride] += made[:, :, part]
    return full[..., : (n - 1) * stride + kernel]


def _run_seanet(seanet: Any, steps: torch.Tensor, state: _SeanetState) -> tuple[torch.Tensor, _SeanetState]:
    """The SEANet decoder over ``steps`` [rows, hidden, n] with the carried ``state`` (the rows' states stacked):
    the samples [rows, 1, n * samples_per_step] of these steps alone, and the state after them."""
    from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

    carried = iter(state)
    after: list[torch.Tensor] = []

    def run(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if isinstance(layer, MimiConv1d):
            before = next(carried)
            if before.shape[-1] == 0:
                after.append(before)
                return layer.conv(x)  # type: ignore[no-any-return]
            inputs = torch.cat([before, x], -1)
            after.append(inputs[..., inputs.shape[-1] - before.shape[-1]:])
            return layer.conv(inputs)  # type: ignore[no-any-return]
        if isinstance(layer, MimiConvTranspose1d):
            tail, conv = next(carried), layer.conv
            full = _conv_transpose(x, conv)
            made = x.shape[-1] * conv.stride[0]  # the outputs no later input reaches
            full[..., : tail.shape[-1]] += tail
            after.append(full[..., made:])
            out = full[..., :made]
            return out if conv.bias is None else out + conv.bias[:, None]
        if isinstance(layer, MimiResnetBlock):
            residual = x
            for inner in layer.block:
                x = run(inner, x)
            return run(layer.shortcut, residual) + x
        return layer(x)  # type: ignore[no-any-return]

    for layer in seanet.layers:
        steps = run(layer, steps)
    return steps, tuple(after)


@dataclass(frozen=True)
class _DecodeState:
    frames: int  # code frames decoded so far
    latents: torch.Tensor  # [1, hidden, upsample_context_frames]: the last latent frames (zeros at the start)
    cache: DynamicCache  # the decoder transformer's (sliding-window) KV cache
    seanet: _SeanetState  # the SEANet decoder's convolution state


class MimiDecodeStream:
    """One request's decode: ``decode(codes)`` with the next [num_codebooks, n] frames returns their n * 1920
    samples (1-D, the model's dtype and device); the outputs, concatenated, equal ``model.decode`` of all the
    frames (float32: within 2e-6 of absmax). A stream is small: the KV cache of one sliding window, one latent
    frame and the SEANet's convolution state. ``snapshot()``/``restore()`` put it back as it was (a decode binds a
    new state; it never changes the old one), for a stage that retries a failed step."""

    def __init__(self, model: MimiModel, num_codebooks: int | None = None,
                 geometry: MimiDecodeGeometry | None = None) -> None:
        from transformers import DynamicCache

        self.model = model
        self.geometry = geometry or mimi_decode_geometry(model)
        self.num_codebooks = _checked_num_codebooks(model.config, num_codebooks)
        assert model.decoder is not None  # mimi_decode_geometry refuses a model without one
        self._transformer = model.decoder.decoder_transformer
        parameter = next(model.decoder.parameters())
        latents = torch.zeros((1, model.config.hidden_size, self.geometry.upsample_context_frames),
                              dtype=parameter.dtype, device=parameter.device)
        self._state = _DecodeState(0, latents, DynamicCache(config=self._transformer.config),
                                   _initial_seanet_state(model))

    @property
    def frames_decoded(self) -> int:
        return self._state.frames

    def snapshot(self) -> object:
        """The stream's state now, for ``restore``."""
        return self._state

    def restore(self, snapshot: object) -> None:
        assert isinstance(snapshot, _DecodeState)
        self._state = snapshot

    def decode(self, codes: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The samples of the next frames ``codes`` ([num_codebooks, n] integers in ``[0, codebook_size)``; a
        ``FieldError`` naming ``codes`` otherwise)."""
        return decode_together([self], [codes])[0]


@torch.inference_mode()
def decode_together(streams: Sequence[MimiDecodeStream], codes: Sequence[torch.Tensor | np.ndarray]) -> list[
        torch.Tensor]:
    """Each stream's samples of its next frames (``codes[i]`` for ``streams[i]``, distinct streams of one model),
    as ``MimiDecodeStream.decode`` gives them one by one; the rows with equal frame counts share one upsampling
    and one SEANet pass, the transformer runs row by row. All the codes are checked (a ``FieldError`` naming
    ``codes``) before any stream changes."""
    if len(streams) != len(codes) or len({id(stream) for stream in streams}) != len(streams):
        raise ValueError("decode_together: one chunk of codes per stream, each stream once")
    if not streams:
        return []
    model = streams[0].model
    if any(stream.model is not model for stream in streams):
        raise ValueError("decode_together: the streams decode with different models")
    checked = [check_codes(c, model.config, stream.num_codebooks) for stream, c in zip(streams, codes, strict=True)]
    decoder = model.decoder
    assert decoder is not None
    parameter = next(decoder.parameters())
    waves: list[torch.Tensor] = [torch.zeros(0, dtype=parameter.dtype, device=parameter.device)] * len(streams)
    groups: dict[tuple[int, int], list[int]] = {}
    for row, (stream, c) in enumerate(zip(streams, checked, strict=True)):
        if c.shape[1]:  # rows of one group stack: equal frame counts and codebooks
            groups.setdefault((c.shape[1], stream.num_codebooks), []).append(row)
    for rows in groups.values():
        for row, wave in zip(rows, _decode_group([streams[r] for r in rows], [checked[r] for r in rows]),
                             strict=True):
            waves[row] = wave
    return waves


def _decode_group(streams: list[MimiDecodeStream], codes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Rows of equal frame counts: one lookup, one upsampling and one SEANet pass over the stacked rows."""
    model, geometry = streams[0].model, streams[0].geometry
    decoder = model.decoder
    assert decoder is not None
    parameter = next(decoder.parameters())
    states = [stream._state for stream in streams]
    count = codes[0].shape[1]
    stacked = torch.stack(codes).to(parameter.device)
    latents = model.quantizer.decode(stacked).to(parameter.dtype)  # per frame
    context = geometry.upsample_context_frames
    # a new stream's context is zero frames, which add nothing to the steps kept (the bias is added once either way)
    inputs = torch.cat([torch.cat([s.latents for s in states]), latents], -1)
    latents = inputs[..., inputs.shape[-1] - context:]
    upsample = decoder.upsample
    steps = inputs if upsample is None else upsample(inputs)[..., context * geometry.steps_per_frame:]
    hidden, caches = [], []
    for row, (stream, state) in enumerate(zip(streams, states, strict=True)):
        cache = _copy_cache(state.cache)
        first = state.frames * geometry.steps_per_frame
        positions = torch.arange(first, first + steps.shape[-1], device=steps.device)[None]
        hidden.append(stream._transformer(steps[row: row + 1].transpose(1, 2), past_key_values=cache,
                                          use_cache=True, position_ids=positions).last_hidden_state)
        caches.append(cache)
    seanet_state = tuple(torch.cat(layer) for layer in zip(*(s.seanet for s in states), strict=True))
    waves, seanet_state = _run_seanet(decoder.decoder_seanet, torch.cat(hidden).transpose(1, 2), seanet_state)
    for row, (stream, state) in enumerate(zip(streams, states, strict=True)):
        stream._state = _DecodeState(state.frames + count, latents[row: row + 1], caches[row],
                                     tuple(layer[row: row + 1] for layer in seanet_state))
    return list(waves[:, 0])


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
