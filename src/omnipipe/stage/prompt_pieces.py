"""A prompt prefilled in pieces: the decoder's inputs for the whole prompt, built once (its multimodal embeddings
merged by the model's own code), fed to the decoder ``prefill_chunk_tokens`` at a time, with the hidden states a
later stage needs gathered over the pieces. A family whose pieces carry more (Qwen3's DeepStack:
``models/qwen3_omni/modeling/deepstack.py``) extends ``next_piece``.

``content_keys`` names each position of a prompt given as embeddings (a talker's, built from the thinker's hidden
states) for the prefix cache: by its input row and its rope position, on which its KV depends with those before it.

``capture_decoder_inputs`` runs a multimodal model's forward only up to its language model and returns what the model
would have fed it (``inputs_embeds``, and whatever else the family's language model reads): the vision and audio
towers run once, whatever the number of pieces."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch


def content_keys(inputs_embeds: torch.Tensor, position_ids: torch.Tensor) -> list[bytes]:
    """Each position's prefix-cache key (``kv_cache.block_hashes``) of a prompt given as its decoder's input rows
    ``inputs_embeds`` [1, T, D] at rope positions ``position_ids`` [..., 1, T] (or [..., T]): a digest of the row's
    bytes and its positions. Two prompts share a block only where every row and position up to its end is the same
    (the KV of a position is a function of those), so a prefix is shared exactly and never approximately."""
    rows = inputs_embeds.detach()[0].contiguous().cpu()
    positions = position_ids.detach().reshape(-1, rows.shape[0]).t().contiguous().cpu().to(torch.int64)
    row_bytes, position_bytes = rows.view(torch.uint8).numpy(), positions.numpy()  # [T, D x bytes], [T, axes]
    return [hashlib.blake2b(row_bytes[i].tobytes() + position_bytes[i].tobytes(), digest_size=16).digest()
            for i in range(rows.shape[0])]


class _Captured(Exception):
    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("decoder inputs captured")
        self.kwargs = kwargs


def capture_decoder_inputs(model: torch.nn.Module, language_model: torch.nn.Module, **kwargs: Any) -> dict[str, Any]:
    """Call ``model(**kwargs)`` and stop it where it calls ``language_model``; return that call's keyword arguments
    (nothing of the language model runs and no cache is touched)."""

    def stop(_: torch.nn.Module, args: tuple[Any, ...], called: dict[str, Any]) -> None:
        if args:
            raise TypeError("capture_decoder_inputs expects the language model to be called with keywords")
        raise _Captured(called)

    handle = language_model.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model(**kwargs)
    except _Captured as captured:
        return captured.kwargs
    finally:
        handle.remove()
    raise RuntimeError(f"{type(model).__name__} returned without calling its language model")


@dataclass
class PromptPieces:
    """A prompt's decoder inputs [1, T, D] and its rope positions [rows, 1, T]; ``keep`` names the hidden-state
    layers gathered."""

    inputs_embeds: torch.Tensor
    position_ids: torch.Tensor
    keep: tuple[int, ...] = ()
    done: int = 0  # tokens fed so far
    hidden: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.inputs_embeds.shape[1])

    @property
    def remaining(self) -> int:
        return self.length - self.done

    def skip(self, tokens: int, hidden: dict[int, torch.Tensor]) -> None:
        """The KV of the first ``tokens`` positions is there already (shared from the prefix cache): start after
        them, with their ``keep`` layers' hidden states [tokens, D] as ``hidden`` gives them."""
        if self.done or not 0 < tokens < self.length:
            raise ValueError(f"cannot skip {tokens} of a prompt of {self.length} tokens ({self.done} fed)")
        self.done = tokens
        for layer in self.keep:
            self.hidden[layer] = [hidden[layer].to(self.inputs_embeds.device)]

    def next_piece(self, most: int) -> dict[str, Any]:
        """The decoder's keyword arguments for the next ``most`` (or fewer) tokens; ``record`` takes its output."""
        start, end = self.done, min(self.length, self.done + most)
        return {"inputs_embeds": self.inputs_embeds[:, start:end], "position_ids": self.position_ids[..., start:end]}

    def record(self, tokens: int, hidden_states: tuple[torch.Tensor, ...] | None) -> None:
        """A piece of ``tokens`` tokens went through; keep its hidden states at the ``keep`` layers."""
        self.done += tokens
        for layer in self.keep:
            if hidden_states is None:
                raise ValueError("the piece's hidden states are needed (output_hidden_states=True)")
            self.hidden.setdefault(layer, []).append(hidden_states[layer][0])

    def gathered(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s hidden states at every prompt position [T, D]."""
        return torch.cat(self.hidden[layer])

    def mark(self) -> tuple[int, dict[int, int]]:
        return self.done, {layer: len(states) for layer, states in self.hidden.items()}

    def rewind(self, mark: tuple[int, dict[int, int]]) -> None:
        self.done, counts = mark
        for layer, states in self.hidden.items():
            del states[counts.get(layer, 0):]
