"""Loading one stage's part of a Qwen2.5-Omni checkpoint (``thinker.``, ``talker.`` or ``token2wav.`` tensors) into
its transformers class, built from its sub-config, without building the other parts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STAGE_PARTS = ("thinker", "talker", "token2wav")


def load_config(directory: Path):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig.from_pretrained(directory, local_files_only=True)


def load_part(directory: Path, part: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The ``part`` of the checkpoint in ``directory`` (thinker, talker or token2wav), in eval mode on ``device``.
    Only the tensors under ``part.`` are read (a sharded checkpoint's index is followed), straight onto a GPU
    (``device_on_load``)."""
    from transformers.models.qwen2_5_omni import (
        Qwen2_5OmniTalkerForConditionalGeneration,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2_5OmniToken2WavModel,
    )

    config = load_config(directory)
    classes: dict[str, tuple[type[PreTrainedModel], Any]] = {
        "thinker": (Qwen2_5OmniThinkerForConditionalGeneration, config.thinker_config),
        "talker": (Qwen2_5OmniTalkerForConditionalGeneration, config.talker_config),
        "token2wav": (Qwen2_5OmniToken2WavModel, config.token2wav_config)}
    if part not in classes:
        raise ValueError(f"unknown part {part!r}; one of {', '.join(STAGE_PARTS)}")
    cls, sub_config = classes[part]
    with quiet_loading():  # its load report would list the other parts' tensors as unexpected
        loaded = cls.from_pretrained(directory, config=sub_config, local_files_only=True, dtype=dtype,
                                     key_mapping={rf"^{part}\.": ""}, output_loading_info=True,
                                     **device_on_load(device))
    # with output_loading_info it returns the model and its load report (transformers types it the model alone)
    model, info = cast("tuple[torch.nn.Module, dict[str, Any]]", loaded)
    missing = sorted(info["missing_keys"])
    if missing:
        raise ValueError(f"{directory}: the {part} is missing {len(missing)} tensors, e.g. {missing[:3]}")
    return model.to(device).eval()


def load_speakers(directory: Path) -> dict[str, dict[str, Any]]:
    """The checkpoint's voices (``spk_dict.pt``): name -> text bos token, speaker condition, reference mel."""
    path = Path(directory) / "spk_dict.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no spk_dict.pt (the voices) in the checkpoint")
    return torch.load(path, weights_only=True)


def list_speakers(options: dict[str, Any]) -> list[str]:
    """The voices of the checkpoint the talker's stage options name (the server's voice list)."""
    return sorted(load_speakers(Path(options["model"])))


def weights_status() -> tuple[bool, str]:
    """What ``omnipipe models`` says: nothing to prepare; the checkpoint is the caller's."""
    return True, ("runs a checkpoint you give: --model DIR or stages.<stage>.options.model "
                  "(`omnipipe tiny-checkpoint qwen2_5_omni DIR` writes a tiny random one)")
