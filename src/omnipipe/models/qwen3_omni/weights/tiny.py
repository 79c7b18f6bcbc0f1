"""A tiny, randomly initialised Qwen3-Omni checkpoint written offline: the real architecture (MoE thinker with audio
and vision encoders, talker with its code predictor, code2wav) at toy sizes, a byte-level BPE tokenizer with the
family's special tokens, and the image processor and feature extractor configs. It exercises every code path of the
family on a CPU in seconds; its outputs are noise (random weights), so tests compare it with the model's own
``generate`` rather than judge what it says. Its thinker never writes an end token (those rows of its output layer
are zero), so an answer runs to the request's ``max_tokens``.

``size="released"`` writes the same files at Qwen3-Omni-30B-A3B-Instruct's sizes (``RELEASED``, from its published
config.json), random weights streamed tensor by tensor (``util/random_checkpoint.py``: ~70 GB in bfloat16, never
whole in memory), to measure throughput on a GPU without a download. End tokens are suppressed the same way: the
thinker's ``<|im_end|>``/``<|endoftext|>`` rows and the talker's codec end row of their output layers are zero, so
their logit is 0 against ~0.6-sigma random logits over the vocabulary and never the greedy or top-k pick; the
thinker rows beyond the tiny tokenizer's tokens are zero too, so it writes only tokens that decode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch

# The corpus the tiny tokenizer's merges are learnt from; the vocabulary stays small so the embedding tables do.
_CORPUS = (
    "hello world, what do you see in this picture? describe the sound you hear. the quick brown fox jumps over "
    "the lazy dog. one two three four five six seven eight nine ten. please answer in a short sentence."
)
_BPE_VOCAB = 320
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                  "<|audio_pad|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
                  "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>")
ROLE_TOKENS = ("system", "user", "assistant")  # single tokens: the talker finds turns by them
MEDIA_TOKENS = {"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
                "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
                "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
CODEBOOK = 64
CODE_GROUPS = 4
SPEAKERS = {"ethan": CODEBOOK + 6, "chelsie": CODEBOOK + 7}  # lower case: generate looks up speaker.lower()


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=_BPE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    tokenizer = Qwen2Tokenizer(tokenizer_object=bpe, extra_special_tokens=dict(MEDIA_TOKENS),
                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens(list(SPECIAL_TOKENS), special_tokens=True)
    tokenizer.add_tokens(list(ROLE_TOKENS))
    return tokenizer


# Qwen3-Omni-30B-A3B-Instruct's sizes (its config.json), merged over the tiny ones by ``size="released"``
_MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [24, 20, 20], "interleaved": True}
RELEASED: dict[str, dict[str, Any]] = {
    "text": {"vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 768, "num_hidden_layers": 48,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
             "num_experts": 128, "num_experts_per_tok": 8, "max_position_embeddings": 65536,
             "rope_parameters": _MROPE},
    "audio": {"encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120, "d_model": 1280,
              "output_dim": 2048, "downsample_hidden_size": 480, "n_window_infer": 800},
    "vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
               "out_hidden_size": 2048, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]},
    "talker_text": {"vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 20,
                    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
                    "moe_intermediate_size": 384, "num_experts": 128, "num_experts_per_tok": 8,
                    "shared_expert_intermediate_size": 768, "max_position_embeddings": 65536,
                    "rope_parameters": _MROPE},
    "code_predictor": {"vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                       "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "num_code_groups": 16},
    "codec": {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
              "codec_think_bos_id": 2156, "codec_think_eos_id": 2157},
    "talker": {"num_code_groups": 16, "thinker_hidden_size": 2048, "accept_hidden_layer": 24,
               "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303}},
    "code2wav": {"codebook_size": 2048, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
                 "intermediate_size": 3072, "num_hidden_layers": 8, "num_quantizers": 16, "decoder_dim": 1536,
                 "sliding_window": 72},
}
# the decoder stacks ``layers`` overrides (a released checkpoint with fewer layers: a smaller file, same widths)
_LAYER_KEYS = {"text": "num_hidden_layers", "talker_text": "num_hidden_layers", "code2wav": "num_hidden_layers",
               "audio": "encoder_layers", "vision": "depth"}


def _sized(parts: dict[str, dict], size: str, layers: int | None) -> dict[str, dict]:
    """The tiny config's parts, with the released sizes merged over them for ``size="released"``."""
    if size == "tiny":
        return parts
    sized = {name: {**part, **RELEASED.get(name, {})} for name, part in parts.items()}
    if layers is not None:
        for name, key in _LAYER_KEYS.items():
            sized[name][key] = layers
        sized["vision"]["deepstack_visual_indexes"] = list(range(min(layers, 3)))
        sized["talker"]["accept_hidden_layer"] = min(layers, RELEASED["talker"]["accept_hidden_layer"])
    return sized


def _config(tokenizer, size: str = "tiny", layers: int | None = None):
    from transformers import Qwen3OmniMoeConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (*SPECIAL_TOKENS, *ROLE_TOKENS)}
    vocab = len(tokenizer)
    hidden = 64
    text = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32,
            "num_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3],
                                "interleaved": True}}
    audio = {"num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 32,
             "d_model": 16, "output_dim": hidden, "downsample_hidden_size": 8, "n_window": 50,
             "n_window_infer": 400, "max_source_positions": 1500}
    vision = {"depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": hidden,
              "num_position_embeddings": 64, "deepstack_visual_indexes": [0]}
    media = {"audio_token_id": ids["<|audio_pad|>"], "image_token_id": ids["<|image_pad|>"],
             "video_token_id": ids["<|video_pad|>"]}
    talker_vocab = CODEBOOK + 1024  # codec ids, then 1024 ids generate suppresses except codec EOS
    codec = {"codec_pad_id": CODEBOOK, "codec_bos_id": CODEBOOK + 1, "codec_eos_token_id": CODEBOOK + 2,
             "codec_nothink_id": CODEBOOK + 3, "codec_think_bos_id": CODEBOOK + 4, "codec_think_eos_id": CODEBOOK + 5}
    talker_text = {"vocab_size": talker_vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "moe_intermediate_size": 16,
                   "num_experts": 4, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 32,
                   "max_position_embeddings": 4096,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3],
                                       "interleaved": True}}
    code_predictor = {"vocab_size": CODEBOOK, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                      "num_code_groups": CODE_GROUPS}
    talker = {"num_code_groups": CODE_GROUPS, "thinker_hidden_size": hidden, "accept_hidden_layer": 1,
              "speaker_id": dict(SPEAKERS)}
    code2wav = {"codebook_size": CODEBOOK, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_quantizers": CODE_GROUPS, "decoder_dim": 32,
                "sliding_window": 72, "layer_scale_initial_scale": 0.1}
    p = _sized({"text": text, "audio": audio, "vision": vision, "talker_text": talker_text, "codec": codec,
                "code_predictor": code_predictor, "talker": talker, "code2wav": code2wav}, size, layers)
    thinker = {"text_config": p["text"], "audio_config": p["audio"], "vision_config": p["vision"],
               "user_token_id": ids["user"], "audio_start_token_id": ids["<|audio_start|>"],
               "vision_start_token_id": ids["<|vision_start|>"], **media}
    talker = {
        "text_config": p["talker_text"], "code_predictor_config": p["code_predictor"], **p["talker"],
        "spatial_merge_size": 2, "audio_config": p["audio"], "vision_start_token_id": ids["<|vision_start|>"],
        "audio_start_token_id": ids["<|audio_start|>"], **media, **p["codec"],
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=p["code2wav"], enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"], tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"], tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"], user_token_id=ids["user"], assistant_token_id=ids["assistant"])


def audible_code2wav(model: torch.nn.Module) -> None:
    """Redraw a random code2wav's weights with unit gain per layer (the library's own init makes a near-silent
    output: about 1e-7), damped on the residual and upsampling paths so activations stay near 1 through the
    decoder and the waveform is audible."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeCausalConvNet,
        Qwen3OmniMoeCausalTransConvNet,
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeCode2WavDecoderBlock,
        Qwen3OmniMoeCode2WavDecoderResidualUnit,
        Qwen3OmniMoeConvNeXtBlock,
    )

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d)):
                torch.nn.init.normal_(module.weight, std=module.weight[0].numel() ** -0.5)
            elif isinstance(module, torch.nn.ConvTranspose1d):  # each output reads kernel / stride taps per input
                fan_in = module.in_channels * module.kernel_size[0] // module.stride[0]
                torch.nn.init.normal_(module.weight, std=fan_in ** -0.5)
            elif isinstance(module, torch.nn.Embedding):
                torch.nn.init.normal_(module.weight)
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.ConvTranspose1d)) \
                    and module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        for module in model.modules():
            if isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):
                module.conv2.conv.weight.mul_(0.2)
            elif isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock):
                cast(Qwen3OmniMoeCausalTransConvNet, module.block[1]).conv.weight.mul_(0.25)
            elif isinstance(module, Qwen3OmniMoeConvNeXtBlock):
                module.gamma.fill_(0.1)
        cast(Qwen3OmniMoeCausalConvNet, cast(Qwen3OmniMoeCode2Wav, model).decoder[-1]).conv.weight.mul_(0.1)


def _write_released(directory: Path, config, tokenizer, seed: int) -> None:
    """The released sizes' random weights, streamed tensor by tensor; config.json beside them."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omnipipe.util.random_checkpoint import Edit, checkpoint_specs, write_random_checkpoint

    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config)
    ends = [tokenizer.convert_tokens_to_ids(token) for token in ("<|im_end|>", "<|endoftext|>")]

    def thinker_head(rows: torch.Tensor) -> None:  # only tokens that decode; never an end token
        rows[len(tokenizer):] = 0.0
        rows[ends] = 0.0

    def codec_head(rows: torch.Tensor) -> None:
        rows[config.talker_config.codec_eos_token_id] = 0.0

    edits: dict[str, Edit] = {"thinker.lm_head.weight": thinker_head, "talker.codec_head.weight": codec_head}
    write_random_checkpoint(directory, checkpoint_specs(model, torch.bfloat16), seed, edits=edits)
    config.save_pretrained(directory)


def write_tiny_checkpoint(directory: str | Path, seed: int = 0, size: str = "tiny",
                          layers: int | None = None) -> Path:
    """Write the tiny checkpoint into ``directory`` (created; files in it are replaced) and return its path. The
    same seed writes the same weights. ``size="released"``: at the released sizes (``RELEASED``; ``layers``: that
    many layers in each decoder and encoder stack instead), written tensor by tensor."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    config = _config(tokenizer, size, layers)
    if size == "released":
        _write_released(directory, config, tokenizer, seed)
    else:
        _write_tiny_weights(directory, config, tokenizer, seed)
    _write_preprocessing(directory, tokenizer)
    return directory


def _write_tiny_weights(directory: Path, config, tokenizer, seed: int) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers' init leaves the talker's fused MoE experts as they were allocated (garbage)
        for name, param in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                torch.nn.init.normal_(param, std=config.talker_config.initializer_range)
    audible_code2wav(model.code2wav)
    with torch.no_grad():  # the thinker never ends on its own: it writes to max_tokens, an answer of the asked length
        for token in ("<|im_end|>", "<|endoftext|>"):
            model.thinker.lm_head.weight[tokenizer.convert_tokens_to_ids(token)] = 0.0
    unset = [name for name, param in model.named_parameters() if not torch.isfinite(param).all()]
    if unset:
        raise RuntimeError(f"tiny checkpoint: parameters left without finite values: {', '.join(unset)}")
    model.save_pretrained(directory)


def _write_preprocessing(directory: Path, tokenizer) -> None:
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    tokenizer.save_pretrained(directory)
    image_processor = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2,
                                               size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})
    image_processor.save_pretrained(directory)
    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000)
    # one preprocessor file holds both, as in the released checkpoints
    merged = {**json.loads(features.to_json_string()), **json.loads(image_processor.to_json_string())}
    (directory / "preprocessor_config.json").write_text(json.dumps(merged, indent=2))
