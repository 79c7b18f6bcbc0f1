"""Load a Moshi checkpoint in transformers' format (``MoshiForConditionalGeneration``: the temporal transformer,
the depth decoder, the 2 x K audio embeddings and Mimi, whose encoder hears the user) on a stage's device and dtype,
its tokenizer and its sampling. What a checkpoint directory must hold is in ``CHECKPOINT_FILES``; the Mimi decoder
stage reads the same directory (``models/mimi/weights/load.py``: Moshi keeps Mimi under ``audio_encoder.``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.models.moshi.modeling.depth import AUDIO_SAMPLING
from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading
from omnipipe.stage.sampling import TokenSamplingParams

if TYPE_CHECKING:
    from transformers import MoshiForConditionalGeneration

# the files a Moshi load reads from its directory (kmhf/hf-moshiko and kmhf/hf-moshika have them; Kyutai's own
# releases, kyutai/moshiko-pytorch-bf16 and the like, name their tensors otherwise and are not read)
CHECKPOINT_FILES = (
    "config.json",  # MoshiConfig: the temporal transformer, depth_decoder_config, audio_encoder_config (Mimi)
    "model.safetensors or model-*-of-*.safetensors with model.safetensors.index.json",  # transformers' names
    "tokenizer.json or tokenizer.model with tokenizer_config.json",  # the text vocabulary (AutoTokenizer)
    "generation_config.json (optional)",  # the text's sampling when a request leaves it out
)


def load_config(directory: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory, local_files_only=True)


def load_model(directory: Path, device: str, dtype: torch.dtype) -> MoshiForConditionalGeneration:
    """The whole model, in eval mode, straight onto a GPU ``device``; its Mimi (which encodes the user's audio) in
    float32 whatever ``dtype``: its quantizer's nearest-code search is where a lower precision would change the
    user's codes."""
    from transformers import MoshiForConditionalGeneration

    with quiet_loading():
        model = MoshiForConditionalGeneration.from_pretrained(directory, dtype=dtype, local_files_only=True,
                                                              **device_on_load(device))
    module = cast(torch.nn.Module, model)  # transformers types ``to`` on its models for one device argument form
    module = module.to(device).eval()
    module.audio_encoder.float()
    return cast("MoshiForConditionalGeneration", module)


def load_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def weights_status() -> tuple[bool, str]:
    """What ``omnipipe models`` says: nothing to prepare; the checkpoint is the caller's."""
    return True, ("runs a checkpoint you give: --model DIR or stages.<stage>.options.model, holding "
                  f"{', '.join(CHECKPOINT_FILES)} (`omnipipe tiny-checkpoint moshi DIR` writes a tiny random one)")


def model_sampling(directory: Path) -> tuple[TokenSamplingParams, TokenSamplingParams]:
    """The checkpoint's own sampling, from its ``generation_config.json`` (greedy when it does not sample): the text's
    (its ``temperature``, else ``temp``: kmhf/hf-moshiko spells the text temperature so, a key transformers does not
    read, so its ``generate`` samples the text at temperature 1; the temperature Kyutai meant is taken here) and the
    depth decoder's (its ``depth_decoder_config``; ``AUDIO_SAMPLING`` without one)."""
    path = directory / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    depth = config.get("depth_decoder_config")
    return _sampling(config, "temp"), AUDIO_SAMPLING if not isinstance(depth, dict) else _sampling(depth, None)


def _sampling(config: dict[str, Any], alias: str | None) -> TokenSamplingParams:
    if not config.get("do_sample", False):
        return TokenSamplingParams()
    temperature = config.get("temperature", config.get(alias) if alias else None)
    return TokenSamplingParams(temperature=float(temperature if temperature is not None else 1.0),
                               top_k=int(config.get("top_k") or 0), top_p=float(config.get("top_p") or 1.0))
