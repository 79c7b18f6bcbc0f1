"""A CSM voice made from a short clip: the clip's Mimi codes, heard by the backbone as the conversation's first turn
(in the voice's base speaker id, without text: the upload gives no transcript) before the text it says, as a
context clip is. CSM keeps a speaker's voice from what it heard of them; the speaker id alone picks one of the
voices it was trained with.

The codes are made once, when the voice is registered (or first used after a restart), on the CPU of the server's
process by the checkpoint's own Mimi encoder (``models/mimi/weights/load.py``: its encoder half only, float32), so
each request carries frames of codes (12.5 a second, ``num_codebooks`` each), not samples. The backbone takes them
as its ``SamplingParams.extra["reference"]`` (``CsmBackboneParams``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.models.csm.prompting import SAMPLE_RATE_HZ


@functools.lru_cache(maxsize=2)
def _encoder(directory: Path) -> tuple[Any, int]:
    """The checkpoint's Mimi encoder (CPU, float32) and the codebooks a CSM frame has."""
    import torch

    from omnipipe.models.mimi.weights.load import load_config, load_mimi

    config = load_config(directory)
    return load_mimi(directory, "cpu", torch.float32, encoder=True, decoder=False, config=config), \
        int(config.num_codebooks)


def clip_codes(directory: Path, samples: np.ndarray) -> list[list[int]]:
    """A 24 kHz clip's Mimi codes as the backbone takes them: one list of ``num_codebooks`` codes a frame, as many
    frames as CSM's prompt gives the clip (``MimiModel.get_encoded_length``)."""
    import torch

    codec, codebooks = _encoder(directory)
    wave = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))[None, None]
    with torch.inference_mode():
        codes = codec.encode(wave, num_quantizers=codebooks).audio_codes[0]  # [codebooks, frames]
        frames = int(codec.get_encoded_length(torch.tensor(len(samples))))
    return codes[:, :frames].T.tolist()


def reference_codes(options: dict[str, Any], samples: np.ndarray, rate_hz: int) -> list[list[int]]:
    """The backbone's ``extra["reference"]`` for a clip (float32 mono at ``rate_hz``), encoded by the checkpoint the
    stage options name (``ServingTraits.reference_voice``)."""
    from omnipipe.util.audio import resample

    if rate_hz != SAMPLE_RATE_HZ:
        samples = resample(samples, rate_hz, SAMPLE_RATE_HZ)
    return clip_codes(Path(options["model"]).expanduser(), samples)
