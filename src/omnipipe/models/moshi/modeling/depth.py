"""Moshi's depth decoder stepped for a whole batch of duplex rows at once: per frame, the ``num_codebooks`` audio
codes that follow the temporal transformer's text token.

It does what ``MoshiDepthDecoder.generate`` does for one row (transformers' ``MoshiForConditionalGeneration``
calls it before each temporal step), for every row together: position 0 reads the text token (the depth decoder's
``text_embed_tokens``) plus the temporal transformer's last hidden state through ``input_projections[0]``, and
``lm_heads[0]`` gives code 0; position ``k`` reads code ``k - 1`` (``embed_tokens[k - 1]``) plus the same hidden
state through ``input_projections[k]``, and ``lm_heads[k]`` gives code ``k``. Every weight is chosen by position
(``MoshiFlexibleLinear``), there is no rope, and every row is at the same position at every step, so one fresh
plain cache of at most ``num_codebooks`` positions serves the batch and no mask is needed beyond the causal one.

Codes are greedy for a greedy request, else sampled as the released checkpoints' generation config asks of the
depth decoder (``AUDIO_SAMPLING``: temperature 0.8, top-k 250), each row from its own request's generator
(``stage/sampling.py``); the codes stay on the device from one position to the next."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, choose_next_tokens

if TYPE_CHECKING:
    from transformers.models.moshi.modeling_moshi import MoshiDepthDecoder

AUDIO_SAMPLING = TokenSamplingParams(temperature=0.8, top_k=250)  # kmhf/hf-moshiko's depth_decoder_config


class BatchedDepthDecoder:
    """Wraps a loaded ``depth_decoder``; call it once per duplex step for all the step's rows."""

    def __init__(self, depth: torch.nn.Module, sampling: TokenSamplingParams = AUDIO_SAMPLING) -> None:
        self.depth = cast("MoshiDepthDecoder", depth)
        self.codebooks = int(self.depth.config.num_codebooks)
        self.sampling = sampling

    def rows(self, greedy: Sequence[bool], generators: Sequence[torch.Generator | None]) -> list[SamplingRow]:
        """The sampling row of each request: greedy, or the depth decoder's sampling with its generator."""
        return [SamplingRow(TokenSamplingParams()) if g else SamplingRow(self.sampling, generator)
                for g, generator in zip(greedy, generators, strict=True)]

    def __call__(self, hidden: torch.Tensor, text: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """``hidden`` [rows, hidden]: each row's last temporal hidden state (after the final norm); ``text`` [rows]:
        the text token sampled from it. Returns the frame's codes [rows, num_codebooks]."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.depth.config)
        context = hidden[:, None]
        inputs = text[:, None]
        codes = []
        for _ in range(self.codebooks):
            out = self.depth(input_ids=inputs, last_hidden_state=context, past_key_values=cache, use_cache=True)
            code = choose_next_tokens(out.logits[:, -1], rows)  # left on the device: no position waits for the host
            codes.append(code)
            inputs = code[:, None]
        return torch.stack(codes, dim=1)
