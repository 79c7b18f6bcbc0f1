"""int8 projections for the CPU decoders: weights quantised once per output channel, activations per call.

A decoder step at batch 1 reads every weight once and does little arithmetic with each, so its time is the time to
stream the weights from memory: float32 weights make Qwen2.5 0.5B read ~2 GB a token. ``Int8Linear`` keeps each
matrix as int8 with one float scale per output row (symmetric, ``absmax / 127``) packed for torch's fbgemm kernel,
which quantises the activations of each call to uint8 (one scale per call) and accumulates in int32: a quarter of
the bytes, and the integer dot products of AVX2.

The answers differ from float32's: a weight moves by up to half a step of its row's scale, an activation by half a
step of its call's. ``omnipipe bench thinker`` prints both greedy texts side by side (and llama.cpp's, whose Q4_K_M
weights and 8-bit activations are another approximation of the same float weights).

Most of that difference is the activations': a row whose range spans 30-80 times its root mean square (the input
of every layer's down projection in Qwen2.5 0.5B, and the tokens with a massive entry) keeps only a few of the 128
levels for its ordinary entries. ``Int8SplitLinear`` (the format ``int8-split``) runs the same packed weights on
each activation row written as two int8 rows, a coarse one and its rounding remainder at 126 times the resolution
(about 14 bits together), through the same kernel in the same call: the answers are then, to about 14 bits, those
of the int8 weights alone, which on ``omnipipe bench quality`` are float32's, at a decode step not much slower than
int8's (the kernel reads the weights once for both rows; a call does twice the integer work, which shows at batch
8 and in prefill). ``docs/benchmarks.md`` has the measurements. It is the default pipeline's format.

``project(x, weight, bias)`` applies either a float matrix (``F.linear``) or an ``Int8Linear``, so a model's forward
reads the same whichever its weights are.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F

# the deploy option stages.thinker.options.weights: the checkpoint as converted; per-row int8 weights with 7-bit
# activations (``Int8Linear``); the same weights with each activation row split in two int8 rows (``Int8SplitLinear``)
WEIGHT_FORMATS = ("float32", "int8", "int8-split")
# the formats whose projections are int8 (fbgemm: CPU only, float32 activations)
INT8_FORMATS = ("int8", "int8-split")


class Int8Linear:
    """``y = x @ W.T + b`` with W held as per-row int8 (fbgemm packed); x float32 of any leading shape."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch marks quantized-tensor constructors as deprecated; they are the
            warnings.simplefilter("ignore")  # documented way to feed fbgemm's prepack in this torch
            quantized = torch.quantize_per_channel(weight, scales, zero_points, axis=0, dtype=torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(quantized, None)
        self._bias = None if bias is None else bias.detach().float()
        self._row_sums = quantized.dequantize().sum(dim=1)  # what the kernel's weights add up to, per output
        self.nbytes = self.out_features * self.in_features + 8 * self.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()
        # every row mapped affinely onto exactly [-1, 1]: the kernel's one scale for the whole call is then every
        # row's own, so a row's result does not depend on the rows beside it (batch-invariant, per-token scales)
        # (x - low) / half - 1 lands on -1 and +1 exactly (a / (a / 2) is exactly 2 in floating point)
        low, high = x.aminmax(dim=1, keepdim=True)
        half = ((high - low) / 2).clamp_(min=1e-30)
        normalized = (x - low).div_(half).sub_(1.0)
        # reduce_range: 7-bit activations, so AVX2's paired uint8 x int8 products cannot saturate int16
        out = torch.ops.quantized.linear_dynamic(normalized, self._packed, True)
        out = out.mul_(half).add_((half + low) * self._row_sums)  # undo: W x = half W n + (half + low) W 1
        if self._bias is not None:
            out += self._bias
        return out.reshape(*shape[:-1], self.out_features)


class Int8SplitLinear(Int8Linear):
    """``Int8Linear``'s weights with finer activations: each row ``x`` is scaled by ``63 / max|x|`` to ``a`` in
    [-63, 63] and written as ``hi = round(a)`` and ``lo = round(126 (a - hi))``, both integers in [-63, 63]; the
    kernel takes the 2n rows of one call with scale 1 and zero point 64 (so it quantises nothing: every value is
    already an integer in [1, 127], 7 bits as AVX2 needs) and returns ``W hi`` and ``W lo`` exactly, combined as
    ``(W hi + W lo / 126) max|x| / 63``. An activation moves by at most 1/252 of a coarse step (about 1/16,000 of
    its row's largest entry); each row's result depends on that row only."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()
        rows = x.shape[0]
        step = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30).div_(63.0)
        split = x.new_empty((2 * rows, self.in_features))
        coarse, fine = split[:rows], split[rows:]
        torch.div(x, step, out=fine)  # a
        torch.round(fine, out=coarse)  # hi
        fine.sub_(coarse).mul_(126.0).round_()  # lo
        both = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(split, 1.0, 64, self._packed)
        out = both[:rows].add_(both[rows:], alpha=1 / 126.0).mul_(step)
        if self._bias is not None:
            out += self._bias
        return out.reshape(*shape[:-1], self.out_features)


Weight = torch.Tensor | Int8Linear


def project(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a float matrix; an ``Int8Linear`` carries its own bias (``bias`` must then be None)."""
    if isinstance(weight, Int8Linear):
        if bias is not None:
            raise ValueError("an Int8Linear carries its bias; pass None")
        return weight(x)
    return F.linear(x, weight, bias)


def check_weight_format(value: Any) -> str:
    """The option's value, or a ValueError naming the field and the choices."""
    if value not in WEIGHT_FORMATS:
        raise ValueError(f"stages.thinker.options.weights: {value!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    return value
