"""Load Mimi (transformers' ``MimiModel``) out of a checkpoint directory that holds it alone (kyutai/mimi) or inside
another model: CSM keeps it under ``codec_model.`` with its config as ``codec_config``, Moshi under
``audio_encoder.`` with ``audio_encoder_config``. Only Mimi's tensors are kept; the encoder or the decoder half can be
left out (a decoder stage never builds the encoder)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading

if TYPE_CHECKING:
    from transformers import MimiConfig, MimiModel


@dataclass(frozen=True)
class MimiLayout:
    """Where a checkpoint keeps Mimi: the prefix of its tensor names, and the key of its config in ``config.json``
    (None: ``config.json`` is Mimi's own)."""

    weights_prefix: str
    config_key: str | None


# a checkpoint's model_type -> where it keeps Mimi
MIMI_LAYOUTS: dict[str, MimiLayout] = {
    "mimi": MimiLayout("", None),
    "csm": MimiLayout("codec_model.", "codec_config"),
    "moshi": MimiLayout("audio_encoder.", "audio_encoder_config"),
}


def load_config(directory: Path) -> Any:
    """The checkpoint's whole config (a Mimi, CSM or Moshi config)."""
    from transformers import AutoConfig

    with quiet_loading():
        return AutoConfig.from_pretrained(directory, local_files_only=True)


def mimi_layout(config: Any, weights_prefix: str | None = None, config_key: str | None = None) -> MimiLayout:
    """The layout of a checkpoint whose config is ``config``: by its ``model_type`` (``MIMI_LAYOUTS``), each part
    overridden by the argument when given. ``ValueError`` when neither tells."""
    known = MIMI_LAYOUTS.get(getattr(config, "model_type", ""))
    if known is None and (weights_prefix is None or config_key is None):
        raise ValueError(f"mimi: a checkpoint of model_type {getattr(config, 'model_type', None)!r} does not say "
                         f"where it keeps Mimi (known: {', '.join(MIMI_LAYOUTS)}): give weights_prefix and "
                         "config_key ('' for a config.json that is Mimi's own)")
    prefix = weights_prefix if weights_prefix is not None else cast(MimiLayout, known).weights_prefix
    key = config_key if config_key is not None else cast(MimiLayout, known).config_key
    return MimiLayout(prefix, key or None)


def mimi_config(config: Any, layout: MimiLayout) -> MimiConfig:
    """Mimi's config inside ``config`` (a copy: the caller may drop a half of it)."""
    import copy

    from transformers import MimiConfig

    found = config if layout.config_key is None else getattr(config, layout.config_key, None)
    if isinstance(found, dict):
        found = MimiConfig(**found)
    if not isinstance(found, MimiConfig):
        raise ValueError(f"mimi: the checkpoint's config has no Mimi config at {layout.config_key or 'its top'} "
                         f"(found {type(found).__name__})")
    return copy.deepcopy(found)


def checkpoint_num_codebooks(config: Any, layout: MimiLayout) -> int:
    """Codebooks per frame the checkpoint's model makes: CSM's and Moshi's ``num_codebooks`` (Moshi decodes 8 of
    Mimi's 32), else all of Mimi's quantizers."""
    if layout.config_key is not None and isinstance(getattr(config, "num_codebooks", None), int):
        return int(config.num_codebooks)
    return int(mimi_config(config, layout).num_quantizers)


def load_mimi(directory: Path, device: str | torch.device, dtype: torch.dtype, layout: MimiLayout | None = None,
              encoder: bool = True, decoder: bool = True, config: Any = None) -> MimiModel:
    """``MimiModel`` with the checkpoint's weights, in eval mode, on ``device`` in ``dtype`` (straight onto a GPU);
    ``encoder``/``decoder`` False leaves that half out. ``layout`` defaults to the checkpoint's
    (``mimi_layout``); ``config`` is the checkpoint's whole config when the caller has read it already."""
    from transformers import MimiModel
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    whole = load_config(directory) if config is None else config
    layout = layout or mimi_layout(whole)
    sub = mimi_config(whole, layout)
    if not encoder:
        sub.encoder_config = None
    if not decoder:
        sub.decoder_config = None
    mapping = {rf"^{re.escape(layout.weights_prefix)}": ""} if layout.weights_prefix else None
    with quiet_loading():  # its report lists the rest of a CSM or Moshi checkpoint as unexpected
        loaded = MimiModel.from_pretrained(directory, config=sub, dtype=dtype, key_mapping=mapping,
                                           local_files_only=True, output_loading_info=True,
                                           **device_on_load(str(device)))
    model, info = cast("tuple[torch.nn.Module, dict[str, Any]]", loaded)
    missing = sorted(info["missing_keys"])
    if missing:
        raise ValueError(f"{directory}: the checkpoint lacks {len(missing)} of Mimi's tensors under "
                         f"{layout.weights_prefix or 'no prefix'!r} (first: {missing[0]})")
    for module in model.modules():  # centroids cached before the weights came would be stale
        if isinstance(module, MimiEuclideanCodebook):
            module._embed = None
    return cast("MimiModel", model.to(device).eval())
