"""Load one stage's part of a Qwen3-Omni checkpoint (``thinker``, ``talker`` or ``code2wav``) without building the
others: the part's class loads from its sub-config and only the tensors under its prefix (the talker's per-expert
MoE tensors fused into its layout), on the stage's device and dtype."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading
from omnipipe.stage.checkpoint_tensors import read_tensors

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_config(directory: Path):
    from transformers import AutoConfig

    with quiet_loading():  # transformers warns of the multimodal rope keys it does read
        return AutoConfig.from_pretrained(directory, local_files_only=True)


def speaker_ids(config) -> dict[str, int]:
    """The checkpoint's voices: name (as the config spells it) -> the talker's codec speaker id."""
    return {str(name): int(index) for name, index in dict(config.talker_config.speaker_id or {}).items()}


def list_speakers(options: dict) -> list[str]:
    """The voices of the checkpoint the talker's stage options name (the server's voice list)."""
    return sorted(speaker_ids(load_config(Path(options["model"]))))


def _fuse_experts(module: torch.nn.Module, directory: Path, prefix: str, missing: list[str]) -> list[str]:
    """The checkpoint stores MoE experts one by one; the module keeps them fused ([experts, 2 x inner, hidden] for
    gate+up, [experts, hidden, inner] for down). Fill the fused tensors ``missing`` lists; return what is still
    missing."""
    params = dict(module.named_parameters())
    left = []
    for name in missing:
        layer, _, kind = name.rpartition(".experts.")
        if kind not in ("gate_up_proj", "down_proj") or name not in params:
            left.append(name)
            continue
        count = params[name].shape[0]
        base = f"{prefix}{layer}.experts"
        keys = [f"{base}.{e}.{p}_proj.weight" for e in range(count)
                for p in (("gate", "up") if kind == "gate_up_proj" else ("down",))]
        tensors = read_tensors(directory, keys)
        if len(tensors) != len(keys):
            left.append(name)
            continue
        if kind == "gate_up_proj":
            fused = torch.stack([torch.cat([tensors[f"{base}.{e}.gate_proj.weight"],
                                            tensors[f"{base}.{e}.up_proj.weight"]]) for e in range(count)])
        else:
            fused = torch.stack([tensors[f"{base}.{e}.down_proj.weight"] for e in range(count)])
        with torch.no_grad():
            params[name].copy_(fused.to(params[name].device, params[name].dtype))
    return left


def load_part(directory: Path, part: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """Build ``part`` of the checkpoint in ``directory`` with only its own weights, in eval mode, loaded straight
    onto a GPU ``device`` (``device_on_load``: never whole in host memory first)."""
    from transformers import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeTalkerForConditionalGeneration,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    config = load_config(directory)
    classes: dict[str, tuple[type[PreTrainedModel], Any]] = {
        "thinker": (Qwen3OmniMoeThinkerForConditionalGeneration, config.thinker_config),
        "talker": (Qwen3OmniMoeTalkerForConditionalGeneration, config.talker_config),
        "code2wav": (Qwen3OmniMoeCode2Wav, config.code2wav_config)}
    cls, sub_config = classes[part]
    if part == "talker":  # its rope index reads the audio encoder's window, kept in the thinker's config
        sub_config.audio_config = config.thinker_config.audio_config
    # the thinker's class maps the checkpoint's ``thinker.`` names itself; the others are told their prefix
    mapping = None if part == "thinker" else {rf"^{part}\.": ""}
    with quiet_loading():  # its load report would list the fused MoE experts filled below as missing
        loaded = cls.from_pretrained(directory, config=sub_config, dtype=dtype, key_mapping=mapping,
                                     local_files_only=True, output_loading_info=True, **device_on_load(device))
    # with output_loading_info it returns the model and its load report (transformers types it the model alone)
    module, info = cast("tuple[torch.nn.Module, dict[str, Any]]", loaded)
    missing = _fuse_experts(module, directory, f"{part}.", sorted(info["missing_keys"]))
    if missing:
        raise ValueError(f"{directory}: the checkpoint lacks {len(missing)} tensors of the {part} "
                         f"(first: {missing[0]})")
    return module.to(device).eval()


def weights_status() -> tuple[bool, str]:
    """What ``omnipipe models`` says: nothing to prepare; the checkpoint is the caller's."""
    return True, ("runs a checkpoint you give: --model DIR or stages.<stage>.options.model "
                  "(`omnipipe tiny-checkpoint qwen3_omni DIR` writes a tiny random one)")
