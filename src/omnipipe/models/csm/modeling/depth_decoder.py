"""CSM's depth decoder stepped for a whole batch of backbone requests at once: per frame, the ``num_codebooks - 1``
codes that follow the backbone's codebook 0.

It does what the model's ``generate`` of the depth decoder does for one request (transformers'
``CsmDepthDecoderForCausalLM``, a fresh cache each frame), for every row together: the first forward reads two
positions, the backbone's last hidden state and the embedding of codebook 0's code (row ``code``), and head 0
gives codebook 1; each later forward ``k`` reads the embedding of codebook ``k``'s code (row ``code + k x vocab`` of
the table the backbone's embeddings share) and head ``k`` gives codebook ``k + 1``. Every input goes through the
decoder's ``inputs_embeds_projector`` (the backbone's width to its own); the head is a plain matmul with
``codebooks_head.weight[k]``, as the model's ``CsmCodebooksHead``. Every row has the same length at every step, so
a plain batched cache serves them all and no mask is needed beyond the causal one.

Codes are greedy for a greedy request, else sampled with the checkpoint's depth-decoder settings (its generation
config's ``depth_decoder_*``), each row from its own request's generator (``stage/sampling.py``), so a seeded
request draws the same codes whatever it is batched with; the codes stay on the device from one codebook to the
next. ``suppress``: ids never chosen (CSM's special ids, which Mimi cannot decode)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, choose_next_tokens

if TYPE_CHECKING:
    from transformers.models.csm.modeling_csm import CsmDepthDecoderForCausalLM


class BatchedDepthDecoder:
    """Wraps a loaded ``depth_decoder``; call it once per backbone step for all the step's rows."""

    def __init__(self, depth_decoder: torch.nn.Module, sampling: TokenSamplingParams,
                 suppress: torch.Tensor | Sequence[int] = ()) -> None:
        self.decoder = cast("CsmDepthDecoderForCausalLM", depth_decoder)
        self.model = self.decoder.model
        self.heads = self.decoder.codebooks_head.weight  # [codebooks - 1, hidden, vocab]
        self.vocab = int(self.heads.shape[-1])
        self.codebooks = int(self.heads.shape[0]) + 1
        self.sampling = sampling
        self.suppress = suppress

    def rows(self, greedy: Sequence[bool], generators: Sequence[torch.Generator | None]) -> list[SamplingRow]:
        """The sampling row of each request: greedy, or the checkpoint's depth sampling with its generator."""
        return [SamplingRow(TokenSamplingParams()) if g else SamplingRow(self.sampling, generator)
                for g, generator in zip(greedy, generators, strict=True)]

    def __call__(self, backbone_hidden: torch.Tensor, first: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """``backbone_hidden`` [rows, backbone hidden]: each row's last backbone hidden state (after its final
        norm); ``first`` [rows]: the codebook-0 code sampled from it. Returns the whole frame [rows, codebooks]."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        embed = self.model.embed_tokens
        inputs = torch.stack((backbone_hidden.to(embed.weight.dtype), embed(first)), dim=1)
        codes = [first]
        for codebook in range(1, self.codebooks):
            out = self.model(inputs_embeds=inputs, past_key_values=cache, use_cache=True)
            logits = torch.nn.functional.linear(out.last_hidden_state[:, -1], self.heads[codebook - 1].T)
            code = choose_next_tokens(logits.float(), rows, self.suppress)  # left on the device
            codes.append(code)
            inputs = embed(code + codebook * self.vocab)[:, None]
        return torch.stack(codes, dim=1)
