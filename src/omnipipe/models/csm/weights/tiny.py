"""A tiny, randomly initialised CSM checkpoint written offline: the real architecture (a Llama backbone with llama3
rope, the depth decoder with its per-codebook head, Mimi with the released convolution geometry) at toy widths, a
byte-level BPE tokenizer with Llama 3's ``<|begin_of_text|>``/``<|end_of_text|>`` and CSM's ``<|AUDIO|>`` and
``<|audio_eos|>`` (the config's ``pad_token_id`` is the audio token's, as released), the chat template and feature
extractor config of sesame/csm-1b, and its generation defaults (sampling at temperature 0.9, top-k 50, for the
backbone and the depth decoder; 125 frames at most). Its outputs are noise (random weights), so tests compare it with
the model's own ``generate``.

Two things a random CSM needs that a trained one has (``_write_tiny_weights``):

- Mimi's codebooks hold vectors (``models/mimi/weights/tiny.py``: transformers' init leaves them zero, and a codec
  with zero codebooks decodes every code alike and encodes everything as code 0, which is CSM's end code);
- the output rows of CSM's special codes (the ids from Mimi's codebook size up: ``codebook_pad_token_id`` and the
  two before it) are zero, so a greedy frame never holds one (their logit 0 is never the largest of the others'),
  and ``generate(output_audio=True)`` can decode every frame it writes.

``size="released"`` writes the same files at sesame/csm-1b's sizes (``released_config``: transformers' ``CsmConfig``
defaults, which are that checkpoint's, with its llama3 rope and kyutai/mimi's codec), random bfloat16 weights
streamed tensor by tensor (``util/random_checkpoint.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnipipe.models.csm.prompting import AUDIO, AUDIO_EOS, BOS, EOS
from omnipipe.models.mimi.weights.tiny import tiny_mimi_config

SPECIAL_TOKENS = (BOS, EOS, AUDIO, AUDIO_EOS)  # in the released tokenizer's order (128000..128003)
CODEBOOKS = 8
CODEBOOK_SIZE = 64  # Mimi's codes per codebook
AUDIO_VOCAB = CODEBOOK_SIZE + 3  # CSM's codebook vocabulary: Mimi's codes, then its special ids (2048..2050 released)
_CORPUS = (
    "[0]hello from sesame. [1]how are you doing today? the quick brown fox jumps over the lazy dog. one two three "
    "four five six seven eight nine ten. [2]please say that again, a little slower this time."
)
_MERGES = 64  # learnt merges beyond the 256 single bytes

# sesame/csm-1b's chat template (transformers' conversion script writes it into the checkpoint): each turn is
# ``<|begin_of_text|>[speaker]text<|end_of_text|>``, its audio (if any) after it as ``<|AUDIO|><|audio_eos|>``
CHAT_TEMPLATE = (
    "\n{%- for message in messages %}\n    {#-- Validate role is a stringified integer --#}\n    {%- if not "
    "message['role'] is string or not message['role'].isdigit() %}\n        {{- raise_exception(\"The role must be an "
    "integer or a stringified integer (e.g. '0') designating the speaker id\") }}\n    {%- endif %}\n\n    {#-- "
    "Validate content is a list --#}\n    {%- set content = message['content'] %}\n    {%- if content is not iterable "
    "or content is string %}\n        {{- raise_exception(\"The content must be a list\") }}\n    {%- endif %}\n\n    "
    "{#-- Collect content types --#}\n    {%- set content_types = content | map(attribute='type') | list %}\n    "
    "{%- set is_last = loop.last %}\n\n    {#-- Last message validation --#}\n    {%- if is_last %}\n        {%- if "
    "'text' not in content_types %}\n            {{- raise_exception(\"The last message must include one item of type "
    "'text'\") }}\n        {%- elif (content_types | select('equalto', 'text') | list | length > 1) or "
    "(content_types | select('equalto', 'audio') | list | length > 1) %}\n            {{- raise_exception(\"At most "
    "two items are allowed in the last message: one 'text' and one 'audio'\") }}\n        {%- endif %}\n\n    {#-- "
    "All other messages validation --#}\n    {%- else %}\n        {%- if content_types | select('equalto', 'text') | "
    "list | length != 1\n              or content_types | select('equalto', 'audio') | list | length != 1 %}\n      "
    "      {{- raise_exception(\"Each message (except the last) must contain exactly one 'text' and one 'audio' "
    "item\") }}\n        {%- elif content_types | reject('in', ['text', 'audio']) | list | length > 0 %}\n          "
    "  {{- raise_exception(\"Only 'text' and 'audio' types are allowed in content\") }}\n        {%- endif %}\n    "
    "{%- endif %}\n{%- endfor %}\n\n{%- for message in messages %}\n    {{- bos_token }}\n    {{- '[' + "
    "message['role'] + ']' }}\n    {{- message['content'][0]['text'] }}\n    {{- eos_token }}\n    {%- if "
    "message['content']|length > 1 %}\n        {{- '<|AUDIO|><|audio_eos|>' }}\n    {%- endif %}\n{%- endfor %}\n"
)

# sesame/csm-1b's generation_config.json (transformers' conversion script writes these)
GENERATION = {"max_new_tokens": 125, "do_sample": True, "top_k": 50, "temperature": 0.9,
              "depth_decoder_do_sample": True, "depth_decoder_top_k": 50, "depth_decoder_temperature": 0.9}

# sesame/csm-1b's rope (llama3 scaling, rewritten by the conversion script for its max positions)
_BACKBONE_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 0.5,
                  "low_freq_factor": 0.125, "original_max_position_embeddings": 1024}
_DEPTH_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 0.0078125,
               "low_freq_factor": 0.001953125, "original_max_position_embeddings": 16}


def tokenizer() -> Any:
    """The tiny tokenizer: a byte-level BPE learnt from a short corpus, then the four special tokens; a text is
    framed ``<|begin_of_text|> ... <|end_of_text|>`` when special tokens are added (Llama 3's, as CSM's tokenizer
    does), its pad token the end token (as the conversion script sets it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + _MERGES, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    size = bpe.get_vocab_size()
    bpe.add_special_tokens(list(SPECIAL_TOKENS))
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0 {EOS}:0", pair=f"{BOS}:0 $A:0 {EOS}:0 {BOS}:1 $B:1 {EOS}:1",
        special_tokens=[(BOS, size), (EOS, size + 1)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, pad_token=EOS)


def _config(tokens: Any) -> Any:
    from transformers import CsmConfig

    ids = {token: int(tokens.convert_tokens_to_ids(token)) for token in SPECIAL_TOKENS}
    return CsmConfig(
        num_codebooks=CODEBOOKS, vocab_size=AUDIO_VOCAB, text_vocab_size=len(tokens), hidden_size=32,
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=ids[BOS], pad_token_id=ids[AUDIO], audio_token_id=ids[AUDIO],
        audio_eos_token_id=ids[AUDIO_EOS], codebook_pad_token_id=AUDIO_VOCAB - 1, codebook_eos_token_id=0,
        rope_parameters={**_BACKBONE_ROPE, "original_max_position_embeddings": 64},
        depth_decoder_config={"num_codebooks": CODEBOOKS, "backbone_hidden_size": 32, "vocab_size": AUDIO_VOCAB,
                              "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "num_key_value_heads": 1,
                              "max_position_embeddings": CODEBOOKS + 1},
        codec_config={"model_type": "mimi", **tiny_mimi_config(CODEBOOK_SIZE, CODEBOOKS)})


def released_config(tokens: Any, layers: int | None = None) -> Any:
    """sesame/csm-1b's config: the class defaults (a 16-layer 2048-wide Llama backbone, a 4-layer depth decoder, 32
    codebooks of 2051 ids, kyutai/mimi as the codec) with its llama3 rope and the tiny tokenizer's special ids
    (``layers``: that many layers in the backbone, the depth decoder and Mimi's transformers instead)."""
    from transformers import CsmConfig

    ids = {token: int(tokens.convert_tokens_to_ids(token)) for token in SPECIAL_TOKENS}
    depth: dict[str, Any] = {"rope_parameters": dict(_DEPTH_ROPE)}
    codec: dict[str, Any] = {"model_type": "mimi"}
    backbone: dict[str, Any] = {}
    if layers is not None:
        depth["num_hidden_layers"] = codec["num_hidden_layers"] = backbone["num_hidden_layers"] = layers
    return CsmConfig(rope_parameters=dict(_BACKBONE_ROPE), depth_decoder_config=depth, codec_config=codec,
                     bos_token_id=ids[BOS], pad_token_id=ids[AUDIO], audio_token_id=ids[AUDIO],
                     audio_eos_token_id=ids[AUDIO_EOS], **backbone)


def write_tiny_checkpoint(directory: str | Path, seed: int = 0, size: str = "tiny",
                          layers: int | None = None) -> Path:
    """Write the checkpoint into ``directory`` (created; files in it are replaced) and return its path. The same
    seed writes the same weights. ``size="released"``: at sesame/csm-1b's sizes (``layers``: that many layers in each
    transformer stack instead), written tensor by tensor."""
    from transformers import CsmProcessor, EncodecFeatureExtractor, GenerationConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokens = tokenizer()
    if size == "released":
        config = released_config(tokens, layers)
        _write_released(directory, config, seed)
    else:
        config = _config(tokens)
        _write_tiny_weights(directory, config, seed)
    GenerationConfig(**GENERATION, bos_token_id=config.bos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(directory)
    features = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
    CsmProcessor(features, tokens, chat_template=CHAT_TEMPLATE).save_pretrained(directory)
    return directory


def _write_tiny_weights(directory: Path, config: Any, seed: int) -> None:
    from transformers import CsmForConditionalGeneration

    from omnipipe.models.mimi.weights.tiny import fill_codebooks

    torch.manual_seed(seed)
    model = CsmForConditionalGeneration(config).eval()
    fill_codebooks(model.codec_model, torch.Generator().manual_seed(seed))  # transformers' init leaves them zero
    special = slice(int(config.codec_config.codebook_size), int(config.vocab_size))
    with torch.no_grad():  # frames hold Mimi's codes only: the special ids' output rows are zero
        model.lm_head.weight[special] = 0.0
        model.depth_decoder.codebooks_head.weight[:, :, special] = 0.0
    unset = [name for name, param in model.named_parameters() if not torch.isfinite(param).all()]
    if unset:
        raise RuntimeError(f"tiny checkpoint: parameters left without finite values: {', '.join(unset)}")
    model.save_pretrained(directory)
    # save_pretrained writes the depth decoder's generation settings into generation_config.json: rewritten after
    (directory / "generation_config.json").unlink(missing_ok=True)


def _write_released(directory: Path, config: Any, seed: int) -> None:
    from transformers import CsmForConditionalGeneration

    from omnipipe.util.random_checkpoint import checkpoint_specs, write_random_checkpoint

    with torch.device("meta"):
        model = CsmForConditionalGeneration(config)
    specs = checkpoint_specs(model, torch.bfloat16)
    write_random_checkpoint(directory, specs, seed)
    config.save_pretrained(directory)
