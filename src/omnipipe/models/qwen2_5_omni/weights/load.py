"""Loading one stage's part of a Qwen2.5-Omni checkpoint (``thinker.``, ``talker.`` or ``token2wav.`` tensors) into
its transformers class, built from its sub-config, without building the other parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnipipe.util.field_error import FieldError

STAGE_PARTS = ("thinker", "talker", "token2wav")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_dir(options: dict[str, Any], stage: str) -> Path:
    """The checkpoint directory named by the stage option ``model``."""
    value = options.get("model")
    field = f"stages.{stage}.options.model"
    if not isinstance(value, (str, Path)) or not str(value):
        raise FieldError(field, "must name a Qwen2.5-Omni checkpoint directory")
    directory = Path(value).expanduser()
    if not (directory / "config.json").is_file():
        raise FieldError(field, f"no Qwen2.5-Omni checkpoint (config.json) in {directory}")
    return directory


def stage_device(options: dict[str, Any], default: str) -> torch.device:
    return torch.device(str(options.get("device") or default))


def stage_dtype(options: dict[str, Any], device: torch.device, stage: str) -> torch.dtype:
    """The stage option ``dtype``; by default float32 on CPU, bfloat16 on CUDA."""
    value = options.get("dtype")
    if value is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if value not in _DTYPES:
        raise FieldError(f"stages.{stage}.options.dtype", f"must be one of {', '.join(_DTYPES)}, got {value!r}")
    return _DTYPES[value]


def load_config(directory: Path):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig.from_pretrained(directory, local_files_only=True)


def load_part(directory: Path, part: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The ``part`` of the checkpoint in ``directory`` (thinker, talker or token2wav), in eval mode on ``device``.
    Only the tensors under ``part.`` are read (a sharded checkpoint's index is followed)."""
    from transformers.models.qwen2_5_omni import (
        Qwen2_5OmniTalkerForConditionalGeneration,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2_5OmniToken2WavModel,
    )

    config = load_config(directory)
    classes = {"thinker": (Qwen2_5OmniThinkerForConditionalGeneration, config.thinker_config),
               "talker": (Qwen2_5OmniTalkerForConditionalGeneration, config.talker_config),
               "token2wav": (Qwen2_5OmniToken2WavModel, config.token2wav_config)}
    if part not in classes:
        raise ValueError(f"unknown part {part!r}; one of {', '.join(STAGE_PARTS)}")
    cls, sub_config = classes[part]
    model, info = cls.from_pretrained(directory, config=sub_config, local_files_only=True, dtype=dtype,
                                      key_mapping={rf"^{part}\.": ""}, output_loading_info=True)
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
