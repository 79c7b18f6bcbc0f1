"""Qwen2.5-Omni served stage by stage: thinker (AR, text) -> talker (AR, codec tokens) -> token2wav (DiT + BigVGAN,
waveform at 24 kHz), on transformers' own Qwen2.5-Omni classes."""
