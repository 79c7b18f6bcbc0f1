"""Moshi's input layout, one column per 80 ms frame, and what a duplex step reads and writes of it.

Every column of the temporal transformer's input is the sum of a text token's embedding and ``2 x K`` audio code
embeddings (``K = num_codebooks``): K of Moshi's own stream and K of the user's. The codec's acoustic codebooks
(1..K-1) are **delayed one frame**: column ``c`` holds codebook 0 (semantic) of frame ``c`` and codebooks 1..K-1 of
frame ``c - 1``, for both streams. Column 0 is the unconditional frame transformers' ``generate`` prepends
(``concat_unconditional_inputs``): the initial text token (``vocab_size``) and the initial audio code
(``audio_vocab_size``) in every codebook; the delayed codebooks of the first frame after it read the same code.

A duplex step at column ``c`` (``c >= 1``; a prompt of T frames fills columns 1..T):

1. the depth decoder, from the last column's hidden state and the text token sampled from it, gives Moshi's column
   ``c``: the semantic code of Moshi's frame ``c`` and the acoustic codes of frame ``c - 1``. At the first column
   after the prompt (c = T + 1), frame ``c - 1`` is the prompt's last frame (or the unconditional frame), and its
   acoustic codes are the prompt's, not the depth decoder's (``generate`` keeps them through its delay mask);
2. the user's column ``c`` is the semantic code of the user's frame ``c`` and the acoustic codes of the user's frame
   ``c - 1`` (``delayed``);
3. one temporal step over the column gives the next text token and hidden state.

So Moshi's frame ``c - 1`` is complete after step ``c`` (its semantic code came one step before its acoustic ones),
and after the last step one more depth call completes the last frame (as ``generate`` does after its loop).
``generate`` itself is not live: after its prompt it feeds as the user's stream the codes of one frame of silence
(``silence_codes``), the same every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import MoshiForConditionalGeneration


@dataclass(frozen=True)
class Layout:
    """The layout's sizes and initial tokens, read from a ``MoshiConfig``."""

    codebooks: int  # K, per stream
    initial_code: int  # audio_vocab_size: the unconditional frame's and the first delayed column's code
    initial_text: int  # vocab_size: the unconditional frame's text token

    @classmethod
    def of(cls, config: Any) -> Layout:
        return cls(int(config.num_codebooks), int(config.audio_vocab_size), int(config.vocab_size))

    def initial_frame(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The unconditional frame's codes [K]."""
        return torch.full((self.codebooks,), self.initial_code, dtype=torch.long, device=device)

    def prompt_columns(self, text: torch.Tensor, moshi: torch.Tensor,
                       user: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A prompt of T frames (``text`` [T] ids, ``moshi`` and ``user`` [K, T] codes) as the T + 1 columns the
        temporal transformer reads first: the unconditional frame, then the prompt's frames, both code streams
        delayed. Returns text [T + 1], moshi [K, T + 1], user [K, T + 1]."""
        initial = self.initial_frame(text.device)[:, None]
        moshi, user = torch.cat([initial, moshi], dim=1), torch.cat([initial, user], dim=1)
        return (torch.cat([torch.tensor([self.initial_text], device=text.device), text]),
                delayed(torch.cat([initial, moshi[:, :-1]], dim=1), moshi, 0),
                delayed(torch.cat([initial, user[:, :-1]], dim=1), user, 0))


def delayed(previous: torch.Tensor, current: torch.Tensor, dim: int) -> torch.Tensor:
    """A stream's column(s): codebook 0 of ``current`` and codebooks 1.. of ``previous``, the codebooks along
    ``dim`` (0 for [K, T] frames, 1 for a step's [rows, K])."""
    return torch.cat([current.narrow(dim, 0, 1), previous.narrow(dim, 1, previous.shape[dim] - 1)], dim=dim)


class ColumnEmbedder:
    """The temporal transformer's input rows of columns, summed in the order transformers' Moshi sums them (the
    audio codes' embeddings, Moshi's stream then the user's, then the text token's), so a step's input is the
    model's own to the bit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = cast("MoshiForConditionalGeneration", model)

    def __call__(self, text: torch.Tensor, moshi: torch.Tensor, user: torch.Tensor) -> torch.Tensor:
        """``text`` [rows, L], ``moshi`` and ``user`` [rows, K, L] -> input rows [rows, L, hidden]."""
        codes = torch.cat([moshi, user], dim=1)
        audio = sum(self.model.embed_tokens[book](codes[:, book]) for book in range(codes.shape[1]))
        return cast(torch.Tensor, audio) + self.model.decoder.model.embed_tokens(text)
