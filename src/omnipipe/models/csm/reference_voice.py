"""A CSM voice made from a short clip: the clip's Mimi codes, heard by the backbone as the conversation's first turn
(in the voice's base speaker id, with what the clip says when the upload gives its transcript, else without text)
before the text it says, as a context clip is. CSM keeps a speaker's voice from what it heard of them, and hears a
clip best with its words (sesame's own prompts give every context clip its transcript); the speaker id alone picks
one of the voices it was trained with.

The codes are made once, when the voice is registered (or first used after a restart), on the CPU of the server's
process by the checkpoint's own Mimi encoder (``models/mimi/weights/load.py``: its encoder half only, float32), so
each request carries frames of codes (12.5 a second, ``num_codebooks`` each), not samples. The backbone takes them
and the transcript as its ``SamplingParams.extra["reference"]`` (``CsmBackboneParams``). A clip (with its
transcript) that leaves the model no position for the text to say is refused when it is registered, naming
``audio`` (or ``text``), rather than at every request."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.models.csm.prompting import FRAME_RATE_HZ, SAMPLE_RATE_HZ, CsmPrompts, Turn
from omnipipe.models.csm.weights.load import DEFAULT_SPEAKERS
from omnipipe.util.field_error import FieldError


@functools.lru_cache(maxsize=2)
def _checkpoint(directory: Path) -> tuple[Any, int, CsmPrompts]:
    """The checkpoint's Mimi encoder (CPU, float32), the codebooks a CSM frame has and its prompt builder (which
    counts a turn's positions against the model's)."""
    import torch

    from omnipipe.models.mimi.weights.load import load_config, load_mimi

    config = load_config(directory)
    codec = load_mimi(directory, "cpu", torch.float32, encoder=True, decoder=False, config=config)
    return codec, int(config.num_codebooks), CsmPrompts(directory, config, codec)


def clip_codes(directory: Path, samples: np.ndarray) -> list[list[int]]:
    """A 24 kHz clip's Mimi codes as the backbone takes them: one list of ``num_codebooks`` codes a frame, as many
    frames as CSM's prompt gives the clip (``MimiModel.get_encoded_length``)."""
    import torch

    codec, codebooks, _ = _checkpoint(directory)
    wave = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))[None, None]
    with torch.inference_mode():
        codes = codec.encode(wave, num_quantizers=codebooks).audio_codes[0]  # [codebooks, frames]
        frames = int(codec.get_encoded_length(torch.tensor(len(samples))))
    return codes[:, :frames].T.tolist()


def _check_room(directory: Path, codes: list[list[int]], text: str, speaker: str) -> None:
    """A FieldError naming ``text`` or ``audio`` when the voice's turn leaves no position for a reply to the
    shortest text (an empty one), counted with ``speaker``'s id."""
    import torch

    prompts = _checkpoint(directory)[2]
    heard = Turn(speaker, text, codes=torch.tensor(codes, dtype=torch.long), text_field="text", audio_field="audio")
    try:
        prompts([heard], speaker, "")
    except FieldError as exc:
        if exc.field != "prompt":
            raise
        raise FieldError("audio", f"the clip's {len(codes)} frames ({len(codes) / FRAME_RATE_HZ:.1f} s) and its "
                         f"transcript leave no room for a reply in the model's {prompts.max_positions} positions; "
                         "give a shorter clip") from None


def reference_codes(options: dict[str, Any], samples: np.ndarray, rate_hz: int,
                    text: str | None = None) -> dict[str, Any]:
    """The backbone's ``extra["reference"]`` for a clip (float32 mono at ``rate_hz``) and what it says (``text``;
    None: heard without words), encoded by the checkpoint the stage options name (``ServingTraits.reference_voice``).
    The turn is counted against the model's positions in the longest speaker id the stage offers."""
    from omnipipe.util.audio import resample

    if rate_hz != SAMPLE_RATE_HZ:
        samples = resample(samples, rate_hz, SAMPLE_RATE_HZ)
    directory = Path(options["model"]).expanduser()
    codes = clip_codes(directory, samples)
    _check_room(directory, codes, text or "", str(int(options.get("speakers", DEFAULT_SPEAKERS)) - 1))
    return {"codes": codes} if text is None else {"codes": codes, "text": text}
