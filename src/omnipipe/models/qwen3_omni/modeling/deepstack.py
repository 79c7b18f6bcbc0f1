"""Qwen3-Omni's DeepStack in a prompt prefilled in pieces: the vision tower's embeddings of a few of its layers are
added to the language model's hidden states at the visual positions of its first layers. ``DeepStackPieces`` is
``PromptPieces`` with the prompt's visual positions mask [1, T] and those embeddings [visual positions, D] per
layer: each piece carries its slice of the mask and the rows of the visual positions it holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnipipe.stage.prompt_pieces import PromptPieces


@dataclass
class DeepStackPieces(PromptPieces):
    visual_pos_masks: torch.Tensor | None = None
    deepstack_visual_embeds: list[torch.Tensor] | None = None

    def next_piece(self, most: int) -> dict[str, Any]:
        start = self.done
        piece = super().next_piece(most)
        if self.visual_pos_masks is None or self.deepstack_visual_embeds is None:
            return piece
        mask = self.visual_pos_masks[:, start:start + int(piece["inputs_embeds"].shape[1])]
        if bool(mask.any()):
            before = int(self.visual_pos_masks[:, :start].sum())
            rows = slice(before, before + int(mask.sum()))
            piece["visual_pos_masks"] = mask
            piece["deepstack_visual_embeds"] = [layer[rows] for layer in self.deepstack_visual_embeds]
        return piece
