"""A tiny, randomly initialised Voxtral Realtime checkpoint written offline: the real architecture (the causal
streaming encoder, the projector of four stacked frames, the Mistral-like language model with its ada-RMSNorm
conditioned on the delay) at toy widths, a tiny ``tekken.json`` (the Voxtral family's byte-level BPE and Mistral's
special tokens at their ranks, plus ``[STREAMING_PAD]`` and ``[STREAMING_WORD]``) carrying the streaming ``audio``
section mistral-common reads (480 ms delay, left padding), and ``VoxtralRealtimeFeatureExtractor``'s config.

Its weights are drawn wider than the library's (``_TINY_INIT``) and its sliding windows are small (the encoder's
96 frames, the language model's 48 positions), so a few seconds of audio already slide past them. Its outputs are
noise (random weights), so tests compare it with the model's own ``generate``. Its end token's row of the output
layer (tied to the input embeddings, so the end token's embedding too) is zero, so a transcript runs to the end of
its audio.

``size="released"`` writes the same files at Voxtral-Mini-4B-Realtime-2602's sizes (``RELEASED``: transformers'
``VoxtralRealtimeConfig`` defaults), random bfloat16 weights streamed tensor by tensor
(``util/random_checkpoint.py``), the embedding rows beyond the tiny tokenizer's tokens and the end token's zero."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from omnipipe.models.voxtral.prompting import EOS, TEKKEN_FILE
from omnipipe.models.voxtral.weights.tiny import tekken_json as voxtral_tekken_json
from omnipipe.models.voxtral_realtime.prompting import STREAMING_PAD, STREAMING_WORD

# filler ranks of the Voxtral family's tiny tokenizer given the streaming tokens
_STREAMING_RANKS = {32: STREAMING_PAD, 33: STREAMING_WORD}
# tekken.json's ``audio`` section as mistral-common reads it (``AudioConfig``): 12.5 tokens a second, a 480 ms
# delay (6 tokens) and 16 tokens of silence on the left
AUDIO_SECTION: dict[str, Any] = {
    "sampling_rate": 16000, "frame_rate": 12.5,
    "audio_encoding_config": {"num_mel_bins": 128, "window_size": 400, "hop_length": 160},
    "transcription_format": "streaming", "transcription_delay_ms": 480.0, "streaming_look_ahead_ms": 2.5,
    "streaming_look_back_ms": 52.5, "streaming_n_left_pad_tokens": 16,
}

# the tiny weights' spread: at the library's 0.02 a random model repeats one token whatever it hears; at 0.4 its
# tokens follow the audio (a few seconds give ~20 different ones), so a test that takes a wrong input can fail
_TINY_INIT = 0.4
# Voxtral-Mini-4B-Realtime-2602's sizes (transformers' defaults), merged over the tiny ones by ``size="released"``
RELEASED: dict[str, dict[str, Any]] = {
    "text": {"vocab_size": 131072, "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 26,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": 8192},
    "audio": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 32,
              "head_dim": 64, "num_mel_bins": 128, "sliding_window": 750, "max_position_embeddings": 1500},
}


def tekken_json() -> dict[str, Any]:
    """The tiny tokenizer in ``tekken.json``'s form, with the streaming tokens and the ``audio`` section."""
    tekken = voxtral_tekken_json()
    for rank, name in _STREAMING_RANKS.items():
        tekken["special_tokens"][rank]["token_str"] = name
    tekken["audio"] = json.loads(json.dumps(AUDIO_SECTION))
    return tekken


def _config(vocab: int, size: str, layers: int | None) -> Any:
    from transformers import VoxtralRealtimeConfig

    text = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": 48, "tie_word_embeddings": True,
            "initializer_range": _TINY_INIT}
    audio = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "head_dim": 8, "num_mel_bins": 128, "sliding_window": 96, "max_position_embeddings": 1500,
             "initializer_range": _TINY_INIT}
    if size == "released":
        text = {**text, **RELEASED["text"], "initializer_range": 0.02}
        audio = {**audio, **RELEASED["audio"], "initializer_range": 0.02}
        if layers is not None:
            text["num_hidden_layers"] = audio["num_hidden_layers"] = layers
    return VoxtralRealtimeConfig(audio_config=audio, text_config=text, tie_word_embeddings=True)


def write_tiny_checkpoint(directory: str | Path, seed: int = 0, size: str = "tiny",
                          layers: int | None = None) -> Path:
    """Write the checkpoint into ``directory`` (created; files in it are replaced) and return its path. The same
    seed writes the same weights. ``size="released"``: at the released sizes (``layers``: that many layers in the
    encoder and the language model instead), written tensor by tensor."""
    from transformers import GenerationConfig, VoxtralRealtimeFeatureExtractor

    from omnipipe.models.voxtral.prompting import load_tekken

    if size not in ("tiny", "released"):
        raise ValueError(f"size: 'tiny' or 'released', got {size!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TEKKEN_FILE).write_text(json.dumps(tekken_json()))
    tokenizer = load_tekken(directory)
    eos = int(tokenizer.convert_tokens_to_ids(EOS))
    config = _config(len(tokenizer), size, layers)
    if size == "released":
        _write_released(directory, config, len(tokenizer), eos, seed)
    else:
        _write_tiny_weights(directory, config, eos, seed)
    GenerationConfig(bos_token_id=1, eos_token_id=eos, pad_token_id=11).save_pretrained(directory)
    VoxtralRealtimeFeatureExtractor(feature_size=128, sampling_rate=16000).save_pretrained(directory)
    return directory


def _write_tiny_weights(directory: Path, config: Any, eos: int, seed: int) -> None:
    from transformers import VoxtralRealtimeForConditionalGeneration

    torch.manual_seed(seed)
    model = VoxtralRealtimeForConditionalGeneration(config).eval()
    with torch.no_grad():  # a transcript never ends on its own: it runs to the end of its audio
        model.lm_head.weight[eos] = 0.0
    unset = [name for name, param in model.named_parameters() if not torch.isfinite(param).all()]
    if unset:
        raise RuntimeError(f"tiny checkpoint: parameters left without finite values: {', '.join(unset)}")
    model.save_pretrained(directory)


def _write_released(directory: Path, config: Any, tokens: int, eos: int, seed: int) -> None:
    from transformers import VoxtralRealtimeForConditionalGeneration

    from omnipipe.util.random_checkpoint import checkpoint_specs, write_random_checkpoint

    with torch.device("meta"):
        model = VoxtralRealtimeForConditionalGeneration(config)

    def rows(weight: torch.Tensor) -> None:  # only tokens that decode; never the end token
        weight[tokens:] = 0.0
        weight[eos] = 0.0

    specs = checkpoint_specs(model, torch.bfloat16)
    # the embedding and the output layer tied to it, as the checkpoint names them (both edited alike, whichever the
    # load keeps)
    tied = [spec.name for spec in specs if spec.name.endswith(("embed_tokens.weight", "lm_head.weight"))]
    write_random_checkpoint(directory, specs, seed, edits=dict.fromkeys(tied, rows))
    config.save_pretrained(directory)
