"""Qwen2.5-Omni's DiT sampler (``Qwen2_5OmniToken2WavDiTModel.sample``) batched over requests' windows, with each
voice's speaker conditioning computed once.

- One ODE for the batch: every window runs the same 10-step RK4 schedule, so each of the sampler's 36 velocity
  evaluations is one DiT forward over all windows (rows conditioned and unconditioned, as classifier-free guidance
  has them in transformers). Windows of different lengths are padded at the end; a padded frame is a key no real
  frame attends to, and it attends to itself alone, so its values stay finite and never reach a real frame. Every
  window's positions and blocks count from its own first frame, as when it is decoded alone.
- What transformers recomputes in every evaluation and is fixed for a request: the ECAPA embedding of the voice's
  reference mel (and of silence, guidance's unconditioned half) is ``SpeakerConditioning``, made once per request;
  the code embeddings, rotary angles and each block's attention mask are made once per batch (transformers' blocks
  rebuild the mask from block distances in every evaluation, ``_decoder_block`` takes it made).
- Precision: the ODE state, its times and the guidance run in float32, or the model's dtype where it is wider
  (``ode_dtype``); the DiT reads its inputs in its own dtype (bfloat16 on a GPU), so a bfloat16 token2wav runs and
  stays close to float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

NUM_STEPS = 10
GUIDANCE_SCALE = 0.5
SWAY_COEFFICIENT = -1.0


@dataclass(frozen=True)
class SpeakerConditioning:
    """A voice as the DiT reads it: ``vector`` [enc_emb_dim], the checkpoint's conditioning vector; ``reference``
    [2, enc_dim], the ECAPA embeddings of its reference mel and of silence (guidance's unconditioned rows)."""

    vector: torch.Tensor
    reference: torch.Tensor


def model_dtype(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def ode_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype of the sampler's state and of the audio: float32 at least (float64 for a float64 model)."""
    return torch.promote_types(model_dtype(module), torch.float32)


@torch.no_grad()
def speaker_conditioning(token2wav: Any, conditioning: torch.Tensor,
                         reference_mel: torch.Tensor) -> SpeakerConditioning:
    """The voice's conditioning [1, enc_emb_dim] and reference mel [1, frames, mel_dim] encoded once, as every DiT
    evaluation of transformers encodes them (the reference and zeros in one ECAPA call)."""
    dit = token2wav.code2wav_dit_model
    dtype = model_dtype(dit)
    reference = reference_mel.to(dtype)
    encoded = dit.input_embed.spk_encoder(torch.cat([reference, torch.zeros_like(reference)], dim=0))
    return SpeakerConditioning(conditioning.reshape(-1).to(dtype), encoded)


@dataclass(frozen=True)
class _BatchInputs:
    """What the batch's DiT evaluations share: rows [2B, F, ...] (B conditioned, then B unconditioned)."""

    fixed_features: torch.Tensor  # [2B, F, enc_dim + emb_dim + enc_emb_dim]: reference, codes, speaker vector
    position_embeddings: tuple[torch.Tensor, torch.Tensor]
    attention_masks: list[torch.Tensor]  # per transformer block, additive [2B or 1, 1, F, F]


def _attention_masks(dit: Any, lengths: torch.Tensor, frames: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each block's attention mask as ``DiTDecoderLayer`` makes it from block distances (a frame sees its block,
    and the one before or after where the layer looks back or ahead), as an additive mask made once for the batch,
    with a padded key out of every real query's reach and each padded query seeing only itself."""
    device = lengths.device
    blocks = torch.arange(frames, device=device) // dit.block_size
    diff = (blocks[None, :] - blocks[:, None])[None]  # key block - query block, [1, F, F]
    padded_keys = torch.arange(frames, device=device)[None, :] >= lengths[:, None]  # [B, F]
    hidden = None
    if bool(padded_keys.any()):
        hidden = padded_keys[:, None, :] & ~torch.eye(frames, dtype=torch.bool, device=device)
        hidden = torch.cat([hidden, hidden], dim=0)
    masks: dict[tuple[int, int], torch.Tensor] = {}
    for block in dit.transformer_blocks:
        reach = (block.look_backward_block, block.look_ahead_block)
        if reach not in masks:
            visible = (diff >= -reach[0]) & (diff <= reach[1])
            if hidden is not None:
                visible = visible & ~hidden
            additive = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, float("-inf"))
            masks[reach] = additive[:, None]
    return [masks[(block.look_backward_block, block.look_ahead_block)] for block in dit.transformer_blocks]


def _batch_inputs(dit: Any, codes: torch.Tensor, lengths: torch.Tensor,
                  speakers: Sequence[SpeakerConditioning]) -> _BatchInputs:
    frames = codes.shape[1] * dit.repeats
    code_embed = dit.text_embed(codes)
    unconditioned_code_embed = dit.text_embed(codes, drop_code=True)
    reference = torch.stack([s.reference[0] for s in speakers] + [s.reference[1] for s in speakers])
    vector = torch.stack([s.vector for s in speakers])
    vector = torch.cat([vector, torch.zeros_like(vector)], dim=0)
    fixed = torch.cat((reference[:, None].expand(-1, frames, -1), torch.cat([code_embed, unconditioned_code_embed]),
                       vector[:, None].expand(-1, frames, -1)), dim=-1)
    positions = torch.arange(frames, device=codes.device)[None].expand(fixed.shape[0], -1)
    return _BatchInputs(fixed, dit.rotary_embed(fixed, positions),
                        _attention_masks(dit, lengths * dit.repeats, frames, fixed.dtype))


def _decoder_block(block: Any, hidden: torch.Tensor, time_embedding: torch.Tensor,
                   position_embeddings: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """``DiTDecoderLayer.forward`` given its attention mask (made once per batch: the layer's own forward makes
    it from block distances in every evaluation, at [2B, heads, F, F])."""
    norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.attn_norm(hidden, emb=time_embedding)
    attention = block.attn(hidden_states=norm, position_embeddings=position_embeddings, attention_mask=mask)
    hidden = hidden + gate_msa.unsqueeze(1) * attention
    norm = block.ff_norm(hidden) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return hidden + gate_mlp.unsqueeze(1) * block.ff(norm)


def _velocity(dit: Any, inputs: _BatchInputs, time: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One DiT evaluation for the batch (``Qwen2_5OmniToken2WavDiTModel.forward`` with ``apply_cfg``, the fixed
    inputs made beforehand), guided: state [B, F, mel_dim] -> velocity [B, F, mel_dim], both in the ODE's dtype."""
    dtype = inputs.fixed_features.dtype
    rows = inputs.fixed_features.shape[0]
    # the sinusoid in the ODE's dtype (as transformers has it for a float32 model), then the MLP in the model's
    time_embedding = dit.time_embed.time_embed(time.to(state.dtype).repeat(rows)).to(dtype)
    for layer in dit.time_embed.time_mlp:
        time_embedding = layer(time_embedding)
    hidden = torch.cat([state, state], dim=0).to(dtype)
    hidden = dit.input_embed.proj(torch.cat((hidden, inputs.fixed_features), dim=-1))
    for block, mask in zip(dit.transformer_blocks, inputs.attention_masks, strict=True):
        hidden = _decoder_block(block, hidden, time_embedding, inputs.position_embeddings, mask)
    output = dit.proj_out(dit.norm_out(hidden, time_embedding)).to(state.dtype)
    guided, unconditioned = torch.chunk(output, 2, dim=0)
    return guided + (guided - unconditioned) * GUIDANCE_SCALE


@torch.no_grad()
def dit_mels(token2wav: Any, codes: Sequence[torch.Tensor], speakers: Sequence[SpeakerConditioning],
             noises: Sequence[torch.Tensor], num_steps: int = NUM_STEPS,
             sway_coefficient: float = SWAY_COEFFICIENT) -> list[torch.Tensor]:
    """The DiT's sampler for a batch of windows, each from its given starting noise instead of a fresh draw:
    window i's codes [T_i] with its voice and noise [repeats * T_i, mel_dim] -> its mel [mel_dim, repeats * T_i]
    (in ``ode_dtype``)."""
    dit = token2wav.code2wav_dit_model
    device = dit.proj_out.weight.device
    lengths = [int(c.shape[0]) for c in codes]
    for length, noise in zip(lengths, noises, strict=True):
        if noise.shape[0] != length * dit.repeats:
            raise ValueError(f"noise covers {noise.shape[0]} mel frames, the codes need {length * dit.repeats}")
    longest = max(lengths)
    padded_codes = torch.zeros((len(codes), longest), dtype=torch.long, device=device)
    dtype = ode_dtype(dit)
    initial = torch.zeros((len(codes), longest * dit.repeats, dit.mel_dim), dtype=dtype, device=device)
    for i, (window, noise) in enumerate(zip(codes, noises, strict=True)):
        padded_codes[i, : lengths[i]] = window.to(device=device, dtype=torch.long)
        initial[i, : noise.shape[0]] = noise.to(device=device, dtype=dtype)
    inputs = _batch_inputs(dit, padded_codes, torch.tensor(lengths, device=device), speakers)
    times = torch.linspace(0, 1, num_steps, device=device, dtype=dtype)
    if sway_coefficient is not None:
        times += sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
    solver = RungeKutta4ODESolver(function=lambda time, state: _velocity(dit, inputs, time, state),
                                  initial_value=initial)
    final = solver.integrate(times)[-1]
    return [final[i, : length * dit.repeats].T for i, length in enumerate(lengths)]
