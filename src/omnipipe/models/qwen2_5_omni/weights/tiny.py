"""A tiny, randomly initialised Qwen2.5-Omni checkpoint written offline: the architecture of the real one at toy
sizes (config + safetensors, speakers, a byte-level BPE tokenizer with the family's special tokens and chat template,
and the processor), for tests and benchmarks on a CPU.

``size="released"`` writes the same files at Qwen2.5-Omni-7B's sizes (``RELEASED``: ~10.7B parameters, ~21 GB in
bfloat16), random weights streamed tensor by tensor (``util/random_checkpoint.py``: never whole in memory), to
measure throughput on a GPU without a download. End tokens are suppressed: the thinker's ``<|im_end|>`` and
``<|endoftext|>`` rows of its output layer are zero, and so are the rows beyond the tiny tokenizer's tokens (it writes
only tokens that decode); the talker's codec head has zero rows from the DiT's codebook on (its codec end token among
them), so it writes only codes token2wav embeds. A zero row's logit is 0 against random logits over the vocabulary:
never the greedy or top-k pick, so every answer runs to its ``max_tokens``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniForConditionalGeneration

TINY_MARKER = "omnipipe_tiny_checkpoint.json"

# the family's special tokens, in the order the real tokenizer lists them
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>", "<|vision_pad|>", "<|IMAGE|>",
    "<|VIDEO|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
)
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
}
BASE_VOCAB = 400  # byte-level BPE pieces before the special tokens
THINKER_VOCAB = 448  # BASE_VOCAB + the special tokens, rounded up
# the talker's codec vocabulary: codes 0..CODEC_CODES-1 plus its control tokens
CODEC_CODES = 96
CODEC_PAD, CODEC_START, CODEC_END, CODEC_MASK = 96, 97, 98, 100
TALKER_VOCAB = 104
SPEAKERS = ("Chelsie", "Ethan")
REFERENCE_MEL_FRAMES = 30

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}{{ '<|vision_bos|><|IMAGE|><|vision_eos|>' }}"
    "{% elif part['type'] == 'video' or 'video' in part %}{{ '<|vision_bos|><|VIDEO|><|vision_eos|>' }}"
    "{% elif part['type'] == 'audio' or 'audio' in part %}{{ '<|audio_bos|><|AUDIO|><|audio_eos|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TRAINING_TEXT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and "
    "visual inputs, as well as generating text and speech. Hello! How are you today? Describe the picture and the "
    "sound. What is in this image? What do you hear? The quick brown fox jumps over the lazy dog. system user "
    "assistant 0123456789 .,;:!?'\"()[]{}<>-_/\\ "
)


def _train_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BASE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator([_TRAINING_TEXT] * 4, trainer=trainer)
    vocab = tokenizer.get_vocab()
    merges = [tuple(pair) for pair in json.loads(tokenizer.to_str())["model"]["merges"]]
    # transformers annotates merges as strings and unk_token as required; its BPE takes pairs, and None is no token
    wrapped = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,  # type: ignore[arg-type]
                             eos_token="<|im_end|>", pad_token="<|endoftext|>", errors="replace",
                             extra_special_tokens=EXTRA_SPECIAL_TOKENS)
    wrapped.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(directory)


# Qwen2.5-Omni-7B's sizes (its published config.json), merged over the tiny ones by ``size="released"``. Every figure
# is also transformers' Qwen2_5Omni*Config default unless its line says otherwise.
_MROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]}  # head_dim 128
RELEASED: dict[str, dict[str, Any]] = {
    # the thinker's decoder: Qwen2.5-7B (Qwen2_5OmniTextConfig); its output layer is untied from the embedding
    "text": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
             "rope_parameters": _MROPE},
    # Qwen2.5-VL's window-attention ViT (Qwen2_5OmniVisionEncoderConfig, but hidden_size: that default, 3584, is the
    # output width; the encoder itself is 1280 wide, 16 heads of 80, as in config.json)
    "vision": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "patch_size": 14,
               "out_hidden_size": 3584, "fullatt_block_indexes": [7, 15, 23, 31], "window_size": 112},
    # whisper-large-v3's encoder (Qwen2_5OmniAudioEncoderConfig), projected to the thinker's width
    "audio": {"encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120, "d_model": 1280,
              "output_dim": 3584, "n_window": 100, "max_source_positions": 1500},
    # the talker: config.json's sizes, not Qwen2_5OmniTalkerConfig's defaults (those copy the thinker's 3584-wide
    # decoder): 24 layers 896 wide, 12 heads of 128 (4 KV heads), an 18944-wide MLP, fed the thinker's 3584-wide
    # states. With Qwen2.5-0.5B's 14 heads of 64 and 4864-wide MLP instead, the whole would be 9.8B, not the 10.7B
    # the release lists; with these it is 10.73B.
    "talker": {"vocab_size": 8448, "embedding_size": 3584, "hidden_size": 896, "intermediate_size": 18944,
               "num_hidden_layers": 24, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 128,
               "max_position_embeddings": 32768, "rope_parameters": _MROPE, "tts_codec_start_token_id": 8293,
               "tts_codec_end_token_id": 8294, "tts_codec_pad_token_id": 8292, "tts_codec_mask_token_id": 8296},
    # token2wav's sliding-window DiT (Qwen2_5OmniDiTConfig): codes 0..8192 of the talker's vocabulary embed
    "dit": {"hidden_size": 1024, "num_hidden_layers": 22, "num_attention_heads": 16, "head_dim": 64, "ff_mult": 2,
            "emb_dim": 512, "num_embeds": 8193, "max_position_embeddings": 32768, "look_ahead_layers": [10],
            "look_backward_layers": [0, 20], "enc_emb_dim": 192, "enc_dim": 128,
            "enc_channels": [256, 256, 256, 256, 768], "enc_attention_channels": 64, "enc_se_channels": 64},
    # token2wav's BigVGAN vocoder (Qwen2_5OmniBigVGANConfig): 240 samples a mel frame
    "bigvgan": {"upsample_initial_channel": 1536, "resblock_kernel_sizes": [3, 7, 11],
                "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "upsample_rates": [5, 3, 2, 2, 2, 2],
                "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4]},
}
# the stacks ``layers`` overrides (a released checkpoint with fewer layers: a smaller file, same widths)
_LAYER_KEYS = {"text": "num_hidden_layers", "vision": "depth", "audio": "encoder_layers",
               "talker": "num_hidden_layers", "dit": "num_hidden_layers"}


def _sized(parts: dict[str, dict], size: str, layers: int | None) -> dict[str, dict]:
    """The tiny config's parts, with the released sizes merged over them for ``size="released"``; with ``layers``,
    the layer indexes the released config names (full attention, DiT look-ahead/back) kept in range."""
    if size == "tiny":
        return parts
    sized = {name: {**part, **RELEASED.get(name, {})} for name, part in parts.items()}
    if layers is not None:
        for name, key in _LAYER_KEYS.items():
            sized[name][key] = layers
        vision, dit = sized["vision"], sized["dit"]
        vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < layers] or [layers - 1]
        dit["look_ahead_layers"] = [i for i in dit["look_ahead_layers"] if i < layers]
        dit["look_backward_layers"] = [i for i in dit["look_backward_layers"] if i < layers]
    return sized


def _config(ids: dict[str, int], size: str = "tiny", layers: int | None = None):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniConfig

    hidden = 64
    token_ids = {
        "audio_token_index": ids["<|AUDIO|>"], "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"], "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"], "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
    }
    text = {"vocab_size": THINKER_VOCAB, "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]}}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": hidden,
              "fullatt_block_indexes": [1], "window_size": 56}
    audio = {"encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "d_model": 32,
             "output_dim": hidden, "num_mel_bins": 128, "n_window": 50, "max_source_positions": 1500}
    talker = {
        **token_ids, "vocab_size": TALKER_VOCAB, "embedding_size": hidden, "hidden_size": 48, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 2, 2]},
        "tts_text_start_token_id": ids["<tts_text_bos>"], "tts_text_end_token_id": ids["<tts_text_eod>"],
        "tts_text_pad_token_id": ids["<tts_pad>"], "tts_codec_start_token_id": CODEC_START,
        "tts_codec_end_token_id": CODEC_END, "tts_codec_pad_token_id": CODEC_PAD,
        "tts_codec_mask_token_id": CODEC_MASK,
    }
    token2wav = _token2wav_config()
    p = _sized({"text": text, "vision": vision, "audio": audio, "talker": talker, "dit": token2wav["dit_config"],
                "bigvgan": token2wav["bigvgan_config"]}, size, layers)
    thinker = {**token_ids, "user_token_id": ids["user"] if "user" in ids else ids["<|im_start|>"],
               "text_config": p["text"], "vision_config": p["vision"], "audio_config": p["audio"]}
    return Qwen2_5OmniConfig(thinker_config=thinker, talker_config=p["talker"], enable_audio_output=True,
                             token2wav_config={"dit_config": p["dit"], "bigvgan_config": p["bigvgan"]})


def _token2wav_config() -> dict:
    return {
        "dit_config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16,
                       "ff_mult": 2, "emb_dim": 32, "num_embeds": TALKER_VOCAB, "mel_dim": 80, "repeats": 2,
                       "block_size": 24, "look_ahead_layers": [2], "look_backward_layers": [0, 3], "dropout": 0.0,
                       "max_position_embeddings": 8192, "enc_emb_dim": 32, "enc_dim": 32,
                       "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16, "enc_se_channels": 16},
        "bigvgan_config": {"mel_dim": 80, "upsample_initial_channel": 128, "resblock_kernel_sizes": [3, 7],
                           "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]], "upsample_rates": [5, 3, 2, 2, 2, 2],
                           "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4]},
    }


def _scale_vocoder(bigvgan: torch.nn.Module) -> None:
    """Give the random vocoder's convolutions unit-gain weights, so its waveform has a real amplitude (at the
    default initialisation it is ~1e-7, which would make every relative error meaningless)."""
    with torch.no_grad():
        for module in bigvgan.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                fan_in = module.weight.shape[1] * module.weight.shape[2]
                if isinstance(module, torch.nn.ConvTranspose1d):
                    fan_in = module.weight.shape[0] * module.weight.shape[2] // module.stride[0]
                module.weight.normal_(0.0, 0.5 / fan_in**0.5)


def _speaker(generator: torch.Generator, cond_dim: int = 32) -> dict[str, torch.Tensor]:
    """A random voice: the DiT's speaker condition [1, ``cond_dim``] (its ``enc_emb_dim``) and a reference mel."""
    return {"cond": torch.randn(1, cond_dim, generator=generator),
            "ref_mel": torch.randn(1, REFERENCE_MEL_FRAMES, 80, generator=generator)}


def tiny_token2wav(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The tiny checkpoint's token2wav alone, in memory: (a seeded random ``Qwen2_5OmniToken2WavModel``, a voice's
    conditioning [1, 32], its reference mel [1, frames, 80]), for measuring the streamed decode."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    torch.manual_seed(seed)
    model = Qwen2_5OmniToken2WavModel(Qwen2_5OmniToken2WavConfig(**_token2wav_config())).eval()
    _scale_vocoder(model.code2wav_bigvgan_model)
    voice = _speaker(torch.Generator().manual_seed(seed + 1))
    return model, voice["cond"], voice["ref_mel"]


def write_tiny_checkpoint(directory: Path, seed: int = 0, size: str = "tiny", layers: int | None = None) -> Path:
    """Write a tiny random Qwen2.5-Omni checkpoint into ``directory`` (created if missing) and return it. The same
    ``seed`` writes the same weights; it reloads with ``local_files_only=True``. ``size="released"``: at the released
    sizes (``RELEASED``; ``layers``: that many layers in each decoder and encoder stack instead), written tensor by
    tensor."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from omnipipe.models.qwen2_5_omni.modeling.processor import OmniProcessor

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    # one token's id is an int (transformers types the result int | list[int] for a token and a list alike)
    ids = {token: cast(int, tokenizer.convert_tokens_to_ids(token)) for token in SPECIAL_TOKENS}
    config = _config(ids, size, layers)
    ends = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    if size == "released":
        _write_released(directory, config, ends, len(tokenizer), seed)
    else:
        _write_tiny_weights(directory, config, ends, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    cond_dim = config.token2wav_config.dit_config.enc_emb_dim
    speakers = {
        name: {"bos_token": ids["<tts_text_bos_single>"] if index == 0 else ids["<tts_text_bos>"],
               **_speaker(generator, cond_dim)}
        for index, name in enumerate(SPEAKERS)
    }
    torch.save(speakers, directory / "spk_dict.pt")
    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56)
    feature_extractor = WhisperFeatureExtractor(feature_size=128)
    processor = OmniProcessor(image_processor=image_processor, feature_extractor=feature_extractor,
                                     tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(directory)
    (directory / TINY_MARKER).write_text(json.dumps({"family": "qwen2_5_omni", "seed": seed, "size": size}))
    return directory


def _set_end_tokens(model: Qwen2_5OmniForConditionalGeneration, ends: list[int]) -> None:
    """The end tokens ``generate`` (and the thinker's stage) stops at; ``<|endoftext|>`` pads."""
    for generation in (model.generation_config, model.thinker.generation_config):
        generation.eos_token_id = ends
        generation.pad_token_id = ends[1]


def _write_tiny_weights(directory: Path, config, ends: list[int], seed: int) -> None:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    _scale_vocoder(model.token2wav.code2wav_bigvgan_model)
    _set_end_tokens(model, ends)
    model.save_pretrained(directory)


def _write_released(directory: Path, config, ends: list[int], tokenizer_size: int, seed: int) -> None:
    """The released sizes' random weights, streamed tensor by tensor; config.json beside them."""
    from transformers.models.qwen2_5_omni import Qwen2_5OmniForConditionalGeneration

    from omnipipe.util.random_checkpoint import Edit, checkpoint_specs, write_random_checkpoint

    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(config)
    codes = config.token2wav_config.dit_config.num_embeds  # the codes token2wav embeds; the codec end is above

    def thinker_head(rows: torch.Tensor) -> None:  # only tokens that decode; never an end token
        rows[tokenizer_size:] = 0.0
        rows[ends] = 0.0

    def codec_head(rows: torch.Tensor) -> None:
        rows[codes:] = 0.0

    edits: dict[str, Edit] = {"thinker.lm_head.weight": thinker_head, "talker.codec_head.weight": codec_head}
    write_random_checkpoint(directory, checkpoint_specs(model, torch.bfloat16), seed, edits=edits)
    config.save_pretrained(directory)
    _set_end_tokens(model, ends)
    model.generation_config.save_pretrained(directory)
