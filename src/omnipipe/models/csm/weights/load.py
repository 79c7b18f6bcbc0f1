"""Load a CSM checkpoint in transformers' format (``CsmForConditionalGeneration``: sesame/csm-1b) on a stage's
device and dtype, and read its decoding defaults. What a checkpoint directory must hold is in ``CHECKPOINT_FILES``.

CSM has no list of voices: a voice is the speaker id its prompt writes (``[0]text``), any integer the model was
trained with; sesame/csm-1b's conversations use 0 and 1. The family offers ``0`` to ``speakers - 1`` (the backbone
stage's option, 10 by default) as its voices (``list_speakers``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.stage.checkpoint_options import device_on_load, quiet_loading
from omnipipe.stage.sampling import TokenSamplingParams

if TYPE_CHECKING:
    from transformers import CsmForConditionalGeneration

# the files a CSM load reads from its directory (a download of sesame/csm-1b has them)
CHECKPOINT_FILES = (
    "config.json",  # CsmConfig: the backbone's sizes, depth_decoder_config, codec_config (Mimi), the special ids
    "model.safetensors or model-*-of-*.safetensors with model.safetensors.index.json",  # Mimi under codec_model.
    "tokenizer.json and tokenizer_config.json",  # Llama 3's tokenizer with <|AUDIO|> and <|audio_eos|>
    "generation_config.json (optional)",  # the sampling defaults of the backbone and (depth_decoder_*) its decoder
)
DEFAULT_SPEAKERS = 10  # voices "0".."9" unless the stage option ``speakers`` says otherwise
DEFAULT_MAX_FRAMES = 125  # frames a reply may take without a generation config saying (10 s)
# transformers' defaults for a sampling field a generation config leaves unset
_UNSET = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def load_config(directory: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory, local_files_only=True)


def load_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def load_model(directory: Path, device: str, dtype: torch.dtype) -> CsmForConditionalGeneration:
    """The whole model in eval mode, straight onto a GPU ``device``: the backbone and depth decoder in ``dtype``,
    the codec in float32 (its encoder quantises context clips to codes; a nearest-codebook search in bfloat16 could
    pick other codes than the released float32 one)."""
    from transformers import CsmForConditionalGeneration

    with quiet_loading():
        model = CsmForConditionalGeneration.from_pretrained(directory, dtype=dtype, local_files_only=True,
                                                            **device_on_load(device))
    module = cast(torch.nn.Module, model)  # transformers types ``to`` on its models for one device argument form
    model = cast("CsmForConditionalGeneration", module.to(device).eval())
    model.codec_model.float()
    return model


@dataclass(frozen=True)
class Decoding:
    """A checkpoint's decoding defaults: the backbone's sampling (codebook 0), the depth decoder's (the other
    codebooks; used when the backbone samples), and the frames a reply may take."""

    backbone: TokenSamplingParams
    depth: TokenSamplingParams
    max_frames: int


def _sampling(values: dict[str, Any], prefix: str = "") -> TokenSamplingParams:
    def value(name: str) -> Any:
        given = values.get(prefix + name)
        return _UNSET[name] if given is None else given

    if not values.get(prefix + "do_sample"):
        return TokenSamplingParams()
    return TokenSamplingParams(temperature=float(value("temperature")), top_k=int(value("top_k")),
                               top_p=float(value("top_p")))


def decoding(directory: Path) -> Decoding:
    """The checkpoint's ``generation_config.json`` read as generate reads it: sampled only when ``do_sample``
    (``depth_decoder_do_sample`` for the depth decoder), transformers' defaults (temperature 1, top-k 50) where a
    field is unset; greedy throughout without the file."""
    path = directory / "generation_config.json"
    values: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    frames = values.get("max_new_tokens") or DEFAULT_MAX_FRAMES
    return Decoding(_sampling(values), _sampling(values, "depth_decoder_"), int(frames))


def list_speakers(options: dict[str, Any]) -> list[str]:
    """The voices of the backbone stage's options (the server's voice list): speaker ids ``0`` to ``speakers - 1``."""
    count = options.get("speakers", DEFAULT_SPEAKERS)
    return [str(index) for index in range(int(count))]


def weights_status() -> tuple[bool, str]:
    """What ``omnipipe models`` says: nothing to prepare; the checkpoint is the caller's."""
    return True, ("runs a checkpoint you give: --model DIR or stages.<stage>.options.model, holding "
                  f"{', '.join(CHECKPOINT_FILES)} (`omnipipe tiny-checkpoint csm DIR` writes a tiny random one)")
