"""Load a Voxtral checkpoint in transformers' format (``VoxtralForConditionalGeneration``) on a stage's device and
dtype. What a checkpoint directory must hold is in ``CHECKPOINT_FILES``; the packages it needs, in
``NEEDED_MODULES``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading

if TYPE_CHECKING:
    from transformers import VoxtralForConditionalGeneration

# the files a Voxtral load reads from its directory (a download of mistralai/Voxtral-Mini-3B-2507 has them; its
# consolidated.safetensors and params.json, Mistral's own format, are not read)
CHECKPOINT_FILES = (
    "config.json",  # VoxtralConfig: audio_config, text_config (llama), audio_token_id
    "model.safetensors or model-*-of-*.safetensors with model.safetensors.index.json",  # transformers' names
    "tekken.json",  # the tokenizer, converted by transformers (mistral-common is not needed)
    "preprocessor_config.json",  # WhisperFeatureExtractor: 128 mel bins, 16 kHz, hop 160
)
# the modules a Voxtral stage imports (transformers 4.54 or later has the model; the tekken converter is newer), each
# with what to install when it is missing
NEEDED_MODULES = (
    ("transformers.models.voxtral", "transformers with Voxtral (VoxtralForConditionalGeneration)"),
    ("transformers.integrations.mistral.tokenizer", "transformers with the tekken converter"),
)


def load_config(directory: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory, local_files_only=True)


def load_model(directory: Path, device: str, dtype: torch.dtype) -> VoxtralForConditionalGeneration:
    """The whole model (encoder, projector, language model), in eval mode, straight onto a GPU ``device``."""
    from transformers import VoxtralForConditionalGeneration

    with quiet_loading():
        model = VoxtralForConditionalGeneration.from_pretrained(directory, dtype=dtype, local_files_only=True,
                                                                **device_on_load(device))
    module = cast(torch.nn.Module, model)  # transformers types ``to`` on its models for one device argument form
    return cast("VoxtralForConditionalGeneration", module.to(device).eval())


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True


def weights_status() -> tuple[bool, str]:
    """What ``omnipipe models`` says: nothing to prepare (the checkpoint is the caller's), ready when the packages
    a stage imports are installed."""
    detail = ("runs a checkpoint you give: --model DIR or stages.thinker.options.model, holding "
              f"{', '.join(CHECKPOINT_FILES)} (`omnipipe tiny-checkpoint voxtral DIR` writes a tiny random one)")
    missing = [package for module, package in NEEDED_MODULES if _missing(module)]
    if missing:
        return False, f"needs {'; '.join(missing)}: install a newer transformers; {detail}"
    return True, f"{detail}; needs transformers (installed), not mistral-common"
