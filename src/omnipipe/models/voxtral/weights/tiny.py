"""A tiny, randomly initialised Voxtral checkpoint written offline: the real architecture (a Whisper-style audio
encoder over 30 s windows, the 2-layer projector of four stacked frames, a Llama language model) at toy widths, a
tiny ``tekken.json`` with Mistral's special tokens at their ranks and a byte-level BPE learnt from a short corpus, and
the Whisper feature extractor's config. It keeps the real window (``max_source_positions`` 1500: 3000 mel frames,
375 tokens per 30 s), which costs little at these widths. Its outputs are noise (random weights), so tests compare it
with the model's own ``generate``. Its end token's row of the output layer is zero, so an answer runs to the
request's ``max_tokens``.

``size="released"`` writes the same files at Voxtral-Mini-3B-2507's sizes (``RELEASED``: transformers'
``VoxtralConfig`` defaults, which are that checkpoint's), random bfloat16 weights streamed tensor by tensor
(``util/random_checkpoint.py``), the output rows beyond the tiny tokenizer's tokens and the end token's zero."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import torch

from omnipipe.models.voxtral.prompting import EOS, TEKKEN_FILE

_CORPUS = (
    "what do you hear in this recording? describe the sound and the voice. transcribe the speech. the quick brown "
    "fox jumps over the lazy dog. one two three four five six seven eight nine ten. answer in a short sentence."
)
_MERGES = 96  # learnt merges beyond the 256 single bytes
# Mistral's special tokens at their ranks in the released tekken.json; the other ranks below NUM_SPECIAL are fillers
_SPECIAL_RANKS = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 5: "[AVAILABLE_TOOLS]",
                  6: "[/AVAILABLE_TOOLS]", 7: "[TOOL_RESULTS]", 8: "[/TOOL_RESULTS]", 9: "[TOOL_CALLS]", 10: "[IMG]",
                  11: "<pad>", 12: "[IMG_BREAK]", 13: "[IMG_END]", 14: "[PREFIX]", 15: "[MIDDLE]", 16: "[SUFFIX]",
                  17: "[SYSTEM_PROMPT]", 18: "[/SYSTEM_PROMPT]", 19: "[TOOL_CONTENT]", 24: "[AUDIO]",
                  25: "[BEGIN_AUDIO]", 34: "[TRANSCRIBE]"}
NUM_SPECIAL = 40
AUDIO_TOKEN_ID = 24
_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Voxtral-Mini-3B-2507's sizes, merged over the tiny ones by ``size="released"``
RELEASED: dict[str, dict[str, Any]] = {
    "text": {"vocab_size": 131072, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 30,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-5, "rope_theta": 1e8},
    "audio": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
              "num_mel_bins": 128, "max_source_positions": 1500},
}


def _learnt_ranks() -> list[bytes]:
    """The BPE's tokens as byte strings, by rank: the 256 bytes, then each merge's result in the order learnt."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=256 + _MERGES, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    merges = json.loads(bpe.to_str())["model"]["merges"]
    learnt = [bytes(to_byte[c] for c in (pair[0] + pair[1] if isinstance(pair, list) else pair.replace(" ", "")))
              for pair in merges]
    return [bytes([b]) for b in range(256)] + learnt


def tekken_json() -> dict[str, Any]:
    """The tiny tokenizer in ``tekken.json``'s form: its config, its special tokens (every rank below
    ``NUM_SPECIAL``) and its vocabulary (each token's bytes in base64, by rank)."""
    ranks = _learnt_ranks()
    specials = [{"rank": rank, "token_str": _SPECIAL_RANKS.get(rank, f"<SPECIAL_{rank}>"), "is_control": True}
                for rank in range(NUM_SPECIAL)]
    vocab = [{"rank": rank, "token_bytes": base64.b64encode(token).decode(),
              "token_str": token.decode("utf-8", errors="replace")} for rank, token in enumerate(ranks)]
    config = {"pattern": _PATTERN, "num_vocab_tokens": len(ranks), "default_vocab_size": NUM_SPECIAL + len(ranks),
              "default_num_special_tokens": NUM_SPECIAL, "version": "v7"}
    return {"config": config, "vocab": vocab, "special_tokens": specials}


def _config(vocab: int, size: str, layers: int | None):
    from transformers import VoxtralConfig

    text = {"model_type": "llama", "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1e8, "tie_word_embeddings": False}
    audio = {"hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_mel_bins": 128, "max_source_positions": 1500}
    if size == "released":
        text, audio = {**text, **RELEASED["text"]}, {**audio, **RELEASED["audio"]}
        if layers is not None:
            text["num_hidden_layers"] = audio["num_hidden_layers"] = layers
    return VoxtralConfig(audio_config=audio, text_config=text, audio_token_id=AUDIO_TOKEN_ID,
                         projector_hidden_act="gelu")


def write_tiny_checkpoint(directory: str | Path, seed: int = 0, size: str = "tiny",
                          layers: int | None = None) -> Path:
    """Write the checkpoint into ``directory`` (created; files in it are replaced) and return its path. The same
    seed writes the same weights. ``size="released"``: at the released sizes (``layers``: that many layers in the
    encoder and the language model instead), written tensor by tensor."""
    from transformers import GenerationConfig, WhisperFeatureExtractor

    from omnipipe.models.voxtral.prompting import load_tekken

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
    WhisperFeatureExtractor(feature_size=128, sampling_rate=16000).save_pretrained(directory)
    return directory


def _write_tiny_weights(directory: Path, config, eos: int, seed: int) -> None:
    from transformers import VoxtralForConditionalGeneration

    torch.manual_seed(seed)
    model = VoxtralForConditionalGeneration(config).eval()
    with torch.no_grad():  # an answer never ends on its own: it runs to the asked length
        model.lm_head.weight[eos] = 0.0
    unset = [name for name, param in model.named_parameters() if not torch.isfinite(param).all()]
    if unset:
        raise RuntimeError(f"tiny checkpoint: parameters left without finite values: {', '.join(unset)}")
    model.save_pretrained(directory)


def _write_released(directory: Path, config, tokens: int, eos: int, seed: int) -> None:
    from transformers import VoxtralForConditionalGeneration

    from omnipipe.util.random_checkpoint import checkpoint_specs, write_random_checkpoint

    with torch.device("meta"):
        model = VoxtralForConditionalGeneration(config)

    def head(rows: torch.Tensor) -> None:  # only tokens that decode; never the end token
        rows[tokens:] = 0.0
        rows[eos] = 0.0

    specs = checkpoint_specs(model, torch.bfloat16)
    # the output layer as the checkpoint names it (transformers saves Voxtral's as ``language_model.lm_head``)
    (output,) = [spec.name for spec in specs if spec.name.endswith("lm_head.weight")]
    write_random_checkpoint(directory, specs, seed, edits={output: head})
    config.save_pretrained(directory)
