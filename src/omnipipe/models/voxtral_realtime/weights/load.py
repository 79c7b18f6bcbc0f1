"""Load a Voxtral Realtime checkpoint in transformers' format (``VoxtralRealtimeForConditionalGeneration``) on a
stage's device and dtype. What a checkpoint directory must hold is in ``CHECKPOINT_FILES``; the packages it needs,
in ``NEEDED_MODULES``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.models.voxtral.weights.load import _missing
from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading

if TYPE_CHECKING:
    from transformers import VoxtralRealtimeForConditionalGeneration

# the files a load reads from its directory (a download of mistralai/Voxtral-Mini-4B-Realtime-2602 has them; its
# consolidated.safetensors and params.json, Mistral's own format, are not read)
CHECKPOINT_FILES = (
    "config.json",  # VoxtralRealtimeConfig: audio_config, text_config, audio_length_per_tok, downsample_factor
    "model.safetensors or model-*-of-*.safetensors with model.safetensors.index.json",  # transformers' names
    "tekken.json",  # the tokenizer and its streaming 'audio' section (mistral-common is not needed)
    "preprocessor_config.json",  # VoxtralRealtimeFeatureExtractor: 128 mel bins, 16 kHz, hop 160
)
NEEDED_MODULES = (
    ("transformers.models.voxtral_realtime", "transformers 5.2 or later (VoxtralRealtimeForConditionalGeneration)"),
    ("transformers.integrations.mistral.tokenizer", "transformers with the tekken converter"),
)


def load_config(directory: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory, local_files_only=True)


def load_model(directory: Path, device: str, dtype: torch.dtype) -> VoxtralRealtimeForConditionalGeneration:
    """The whole model (encoder, projector, language model, time embedding), in eval mode, on ``device``."""
    from transformers import VoxtralRealtimeForConditionalGeneration

    with quiet_loading():
        model = VoxtralRealtimeForConditionalGeneration.from_pretrained(directory, dtype=dtype, local_files_only=True,
                                                                        **device_on_load(device))
    module = cast(torch.nn.Module, model)
    return cast("VoxtralRealtimeForConditionalGeneration", module.to(device).eval())


def weights_status() -> tuple[bool, str]:
    """What ``omnipipe models`` says: nothing to prepare (the checkpoint is the caller's), ready when the packages
    a stage imports are installed."""
    detail = ("runs a checkpoint you give: --model DIR or stages.transcriber.options.model, holding "
              f"{', '.join(CHECKPOINT_FILES)} (`omnipipe tiny-checkpoint voxtral_realtime DIR` writes a tiny random "
              "one)")
    missing = [package for module, package in NEEDED_MODULES if _missing(module)]
    if missing:
        return False, f"needs {'; '.join(missing)}: install a newer transformers; {detail}"
    return True, f"{detail}; needs transformers (installed), not mistral-common"
