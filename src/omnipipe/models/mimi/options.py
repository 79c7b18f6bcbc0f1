"""The Mimi decoder stage's options (deploy ``stages.<name>.options``) beyond what every checkpoint stage takes
(``stage/checkpoint_options.py``: model, dtype, gpu_memory_fraction)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import CheckpointOptions, positive_int
from omnipipe.util.field_error import FieldError


@dataclass(frozen=True)
class MimiDecoderOptions(CheckpointOptions):
    """Where the checkpoint ``model`` keeps Mimi, by default read from its ``model_type``
    (``weights/load.py``'s ``MIMI_LAYOUTS``: a kyutai/mimi directory, CSM's ``codec_model.`` + ``codec_config``,
    Moshi's ``audio_encoder.`` + ``audio_encoder_config``): ``weights_prefix``, the prefix of its tensor names
    (``""``: none); ``config_key``, the key of its config in ``config.json`` (``""``: the file is Mimi's own).
    ``num_codebooks``: codebooks per frame of the codes the stage receives (default: the checkpoint's
    ``num_codebooks`` for CSM and Moshi, else all of Mimi's quantizers)."""

    weights_prefix: str | None = None
    config_key: str | None = None
    num_codebooks: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("weights_prefix", "config_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise FieldError(name, f"must be a string, got {value!r}")
        if self.num_codebooks is not None:
            positive_int("num_codebooks", self.num_codebooks, 1024)
