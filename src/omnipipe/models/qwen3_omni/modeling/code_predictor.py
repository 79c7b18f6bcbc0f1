"""Qwen3-Omni's code predictor stepped for a whole batch of talker requests at once: per codec frame, the
``num_code_groups - 1`` residual codes that follow the talker's own code.

It does what the model's ``generate`` of the predictor does for one request (transformers'
``Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration``), for every row together: the first forward reads
two positions, the talker's last hidden state and the embedding of the code it just sampled, and the predictor's
``lm_head[0]`` gives the first residual; each later step ``j`` reads the embedding of residual ``j`` (the
predictor's ``codec_embedding[j - 1]``) and ``lm_head[j]`` gives the next. Every row has the same length at every
step, so a plain batched cache serves them all and no mask is needed beyond the causal one. The talker's next input
is the sum of the frame's code embeddings: its own code's, then each residual's through ``codec_embedding``.

Residuals are greedy for a greedy request, else sampled as the model does (temperature 1, top-k 50, top-p 0.8),
each row from its own request's generator (``stage/sampling.py``), so a seeded request draws the same residuals
whatever it is batched with; the codes stay on the device from one residual to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, choose_next_tokens

if TYPE_CHECKING:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration,
    )

RESIDUAL_SAMPLING = TokenSamplingParams(temperature=1.0, top_k=50, top_p=0.8)  # the model's, when it samples


class BatchedCodePredictor:
    """Wraps a loaded ``talker.code_predictor``; call it once per talker step for all the step's rows."""

    def __init__(self, predictor: torch.nn.Module) -> None:
        self.predictor = cast("Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration", predictor)
        self.model = self.predictor.model
        self.residuals = len(self.predictor.lm_head)  # num_code_groups - 1

    def rows(self, greedy: Sequence[bool], generators: Sequence[torch.Generator | None]) -> list[SamplingRow]:
        """The sampling row of each request: greedy, or the model's residual sampling with its generator."""
        return [SamplingRow(TokenSamplingParams()) if g else SamplingRow(RESIDUAL_SAMPLING, generator)
                for g, generator in zip(greedy, generators, strict=True)]

    def __call__(self, talker_hidden: torch.Tensor, code_embeds: torch.Tensor,
                 rows: list[SamplingRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """``talker_hidden`` [rows, 1, hidden]: each row's last talker hidden state; ``code_embeds`` [rows, 1,
        hidden]: the talker's embedding of the code it sampled from it. Returns the residual codes [rows, groups - 1]
        and the frame's summed code embeddings [rows, 1, hidden] (the talker's next input before the text)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        inputs = torch.cat((talker_hidden, code_embeds), dim=1)
        codes, embeds = [], [code_embeds]
        for step in range(self.residuals):
            out = self.model(inputs_embeds=inputs, past_key_values=cache, use_cache=True)
            logits = self.predictor.lm_head[step](out.last_hidden_state)[:, -1]
            code = choose_next_tokens(logits, rows)  # left on the device: no step waits for the host
            inputs = self.model.codec_embedding[step](code)[:, None]
            codes.append(code)
            embeds.append(inputs)
        return torch.stack(codes, dim=1), torch.cat(embeds, dim=1).sum(1, keepdim=True)
