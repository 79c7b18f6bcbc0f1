"""Qwen3-Omni served stage by stage: thinker (MoE, text/image/audio/video in) -> talker with its code predictor ->
code2wav, on transformers' own classes."""
