"""The CSM backbone's stage options (deploy ``stages.backbone.options``) beyond a batched decoder's
(``stage/checkpoint_options.py``: model, dtype, the KV budget, prefill pieces, prefix caching), and what a request
tells it in ``SamplingParams.extra`` (``CsmBackboneParams``).

A speaker is CSM's speaker id, written ``[id]`` before each turn's text: a string of digits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnipipe.models.csm.weights.load import DEFAULT_SPEAKERS
from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions, positive_int
from omnipipe.util.field_error import FieldError

MAX_CONTEXT_TURNS = 8  # clips one request may give as context
MAX_REFERENCE_FRAMES = 375  # 30 s of codes at 12.5 frames per second: the longest clip a voice is made from
MAX_TEXT_CHARS = 4096


def check_speaker(name: str, value: Any) -> str:
    """``value`` if it is a speaker id (a string of 1 to 4 digits), else a FieldError naming ``name``."""
    if not isinstance(value, str) or not value.isdigit() or not value.isascii() or len(value) > 4:
        raise FieldError(name, f"must be a speaker id: a string of digits such as '0', got {value!r}")
    return value


@dataclass(frozen=True)
class CsmBackboneOptions(DecoderCheckpointOptions):
    """``max_new_tokens``: the frames (12.5 a second) a reply may take when its SamplingParams leave ``max_tokens``
    out (None: the checkpoint's generation config's, else 125); ``speaker``: the speaker id of the voice
    ``default``; ``speakers``: how many speaker ids the server offers as voices (``0`` .. ``speakers - 1``)."""

    max_new_tokens: int | None = None
    speaker: str = "0"
    speakers: int = DEFAULT_SPEAKERS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_new_tokens is not None:
            positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)
        positive_int("speakers", self.speakers, 10_000)
        check_speaker("speaker", self.speaker)


@dataclass(frozen=True)
class CsmBackboneParams:
    """The backbone's ``SamplingParams.extra``:

    - ``speaker``: the speaker id the text is said in (the server's ``voice``); None: the stage option's;
    - ``context``: one ``{"speaker": id, "text": what the clip says}`` per clip of the prompt's
      ``multi_modal_data.audio``, in their order: the conversation before the text, each clip a turn CSM hears
      (both keys optional: the request's speaker, no text);
    - ``reference``: a voice made from a clip (``reference_voice.py``), heard as the first turn in the request's
      speaker: ``{"codes": [[...], ...], "text": "..."}``, its Mimi codes (one list of a code per codebook for each
      frame) and what the clip says (optional: none, the turn's text empty)."""

    speaker: str | None = None
    context: list[dict[str, Any]] | None = None
    reference: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.speaker is not None:
            check_speaker("speaker", self.speaker)
        if self.context is not None:
            if not isinstance(self.context, list) or len(self.context) > MAX_CONTEXT_TURNS:
                raise FieldError("context", f"must be a list of at most {MAX_CONTEXT_TURNS} turns, one per clip")
            for index, turn in enumerate(self.context):
                where = f"context[{index}]"
                if not isinstance(turn, dict) or not set(turn) <= {"speaker", "text"}:
                    raise FieldError(where, "must be a dict with 'speaker' (an id such as '1') and 'text' (what the "
                                     "clip says), both optional")
                if "speaker" in turn:
                    check_speaker(f"{where}.speaker", turn["speaker"])
                text = turn.get("text", "")
                if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
                    raise FieldError(f"{where}.text", f"must be a string of at most {MAX_TEXT_CHARS} characters")
        if self.reference is not None:
            _check_reference(self.reference)


def _check_reference(reference: Any) -> None:
    """A FieldError naming the part of ``reference`` (``CsmBackboneParams.reference``) that is not a voice's codes
    and transcript."""
    if not isinstance(reference, dict) or "codes" not in reference or not set(reference) <= {"codes", "text"}:
        raise FieldError("reference", "must be a dict with 'codes' (the clip's Mimi codes, a list of a code per "
                         "codebook for each frame) and 'text' (what the clip says, optional)")
    text = reference.get("text", "")
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        raise FieldError("reference.text", f"must be a string of at most {MAX_TEXT_CHARS} characters")
    codes = reference["codes"]
    if not isinstance(codes, list) or not 1 <= len(codes) <= MAX_REFERENCE_FRAMES:
        raise FieldError("reference.codes", f"must be a list of 1 to {MAX_REFERENCE_FRAMES} frames of codes")
    width = len(codes[0]) if isinstance(codes[0], list) else 0
    if width == 0 or not all(isinstance(frame, list) and len(frame) == width and
                             all(isinstance(code, int) and not isinstance(code, bool) and code >= 0
                                 for code in frame) for frame in codes):
        raise FieldError("reference.codes", "every frame must be a list of as many codes (integers >= 0) as the "
                         "first")
