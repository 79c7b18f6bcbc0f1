"""A tiny, randomly initialised Moshi checkpoint written offline: the real architecture (the temporal transformer
over text + 2 x 8 codebooks per frame, the depth decoder with per-codebook weights, Mimi) at toy widths, a byte-level
BPE tokenizer learnt from a short corpus (no sentencepiece) with the special tokens at the ranks of Kyutai's 32k
vocabulary (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3), and the released checkpoints' generation config. Its
Mimi is the shared tiny one (``models/mimi/weights/tiny.py``) with its codebooks filled (a random Mimi has all-zero
codebooks: every frame would encode to code 0 and every code decode alike), 8 codebooks of 64 codes (released:
2048). Its outputs are noise (random weights), so tests compare it with the model's own ``generate``.

``size="released"`` writes the same files at kmhf/hf-moshiko's sizes (``MoshiConfig``'s and ``MimiConfig``'s
defaults, which are that checkpoint's: 7,767,037,761 parameters), random bfloat16 weights streamed tensor by tensor
(``util/random_checkpoint.py``), the text output rows beyond the tiny tokenizer's tokens zero (``layers``: that many
layers in the temporal transformer and the depth decoder instead)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from omnipipe.models.mimi.weights.tiny import fill_codebooks, tiny_mimi_config

_CORPUS = (
    "hello, how are you doing today? i am fine, thank you. what would you like to talk about? tell me about the "
    "weather. the quick brown fox jumps over the lazy dog. one two three four five six seven eight nine ten."
)
_BPE_VOCAB = 320
CODEBOOKS = 8  # per stream, as released
CODEBOOK_SIZE = 64  # the audio vocabulary (released: 2048)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3, as in Kyutai's tokenizer_spm_32k_3
# kmhf/hf-moshiko's generation_config.json ("temp" is Kyutai's spelling of the text temperature)
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True, "temp": 0.7, "top_k": 25, "cache_implementation": "sliding_window",
    "depth_decoder_config": {"do_sample": True, "temperature": 0.8, "top_k": 250, "min_length": 9, "max_length": 9,
                             "cache_implementation": "sliding_window"},
}
TINY_DEPTH: dict[str, Any] = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "ffn_dim": 32,
                              "max_position_embeddings": 9, "sliding_window": 8}
TINY_TEXT: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64,
                             "max_position_embeddings": 512, "sliding_window": 512, "num_codebooks": CODEBOOKS}
# kmhf/hf-moshiko's text vocabulary: the rest of its sizes are the config classes' defaults
RELEASED_VOCAB = 32000


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=_BPE_VOCAB, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def _config(vocab: int, size: str, layers: int | None) -> Any:
    from transformers import MoshiConfig

    if size == "released":
        depth: dict[str, Any] = {} if layers is None else {"num_hidden_layers": layers}
        text: dict[str, Any] = {} if layers is None else {"num_hidden_layers": layers}
        # a dict, so the parent sets the depth decoder's input size and vocabularies from its own
        return MoshiConfig(vocab_size=RELEASED_VOCAB, audio_encoder_config={}, depth_decoder_config=depth, **text)
    return MoshiConfig(vocab_size=vocab, audio_encoder_config=tiny_mimi_config(CODEBOOK_SIZE, CODEBOOKS),
                       depth_decoder_config=dict(TINY_DEPTH), **TINY_TEXT)


def write_tiny_checkpoint(directory: str | Path, seed: int = 0, size: str = "tiny",
                          layers: int | None = None) -> Path:
    """Write the checkpoint into ``directory`` (created; files in it are replaced) and return its path. The same
    seed writes the same weights. ``size="released"``: at the released sizes, written tensor by tensor."""
    if size not in ("tiny", "released"):
        raise ValueError(f"size must be 'tiny' or 'released', got {size!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    tokenizer.save_pretrained(directory)
    config = _config(len(tokenizer), size, layers)
    if size == "released":
        _write_released(directory, config, len(tokenizer), seed)
    else:
        _write_tiny_weights(directory, config, seed)
    (directory / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    return directory


def _write_tiny_weights(directory: Path, config: Any, seed: int) -> None:
    from transformers import MoshiForConditionalGeneration

    torch.manual_seed(seed)
    model = MoshiForConditionalGeneration(config).eval()
    fill_codebooks(model, torch.Generator().manual_seed(seed))
    unset = [name for name, param in model.named_parameters() if not torch.isfinite(param).all()]
    if unset:
        raise RuntimeError(f"tiny checkpoint: parameters left without finite values: {', '.join(unset)}")
    model.save_pretrained(directory)


def _write_released(directory: Path, config: Any, tokens: int, seed: int) -> None:
    from transformers import MoshiForConditionalGeneration

    from omnipipe.util.random_checkpoint import checkpoint_specs, write_random_checkpoint

    with torch.device("meta"):
        model = MoshiForConditionalGeneration(config)

    def head(rows: torch.Tensor) -> None:  # only tokens that decode
        rows[tokens:] = 0.0

    specs = checkpoint_specs(model, torch.bfloat16)
    (output,) = [spec.name for spec in specs if spec.name.endswith("decoder.lm_head.weight")]
    write_random_checkpoint(directory, specs, seed, edits={output: head})
    config.save_pretrained(directory)
