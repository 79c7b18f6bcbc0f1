"""Stage handoff for the default family: where a request enters, how text flows thinker -> talker, and the knobs
the talker reads from ``SamplingParams.extra``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.chunk.context import ChunkContext
from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.models.default.attachments import MAX_IMAGES, encoded_image
from omnipipe.util.audio import load_audio
from omnipipe.util.field_error import FieldError

WHISPER_RATE_HZ = 16_000
MAX_AUDIO_S = 120.0
MAX_PROMPT_CHARS = 2_000  # whisper reads at most the last 223 tokens of a prompt
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+")
_CLAUSE_END = re.compile(r"[,;:]\s+")
MIN_CLAUSE_WORDS = 3  # shorter fragments make the voice sound choppy
MAX_RUN_WORDS = 16  # cut an unpunctuated run anyway after this many words
FIRST_CHUNK_WORDS = 4  # the first piece may end at a plain word boundary, to start speaking sooner


@dataclass(frozen=True)
class SpokenPieceOptions:
    """Options of the thinker -> talker edge (deploy ``edges.thinker->talker.options``)."""

    first_chunk_words: int = FIRST_CHUNK_WORDS  # 0: the first piece waits for a clause or sentence end too

    def __post_init__(self) -> None:
        value = self.first_chunk_words
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise FieldError("first_chunk_words", f"must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class PiperTalkerParams:
    """The talker's ``SamplingParams.extra``: ``speed`` scales the speaking rate (2.0: twice as fast)."""

    speed: float = 1.0

    def __post_init__(self) -> None:
        value = self.speed
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.25 <= value <= 4.0:
            raise FieldError("speed", f"must be a number in [0.25, 4], got {value!r}")


@dataclass(frozen=True)
class TranscriptionParams:
    """The encoder's ``SamplingParams.extra``: ``word_timestamps`` adds each segment's words with their times,
    ``prompt`` is text the decoding continues from (spellings, style), ``temperature`` samples the decoding (0:
    greedy). ``fitted_window`` decodes a short clip (a realtime session's turn) in one encoder window fitted to its
    length, cheaper than a 30 s window (``WhisperASR.start_fitted``); ``prefix`` (with it) gives the words the
    transcript starts with."""

    word_timestamps: bool = False
    prompt: str = ""
    temperature: float = 0.0
    fitted_window: bool = False
    prefix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.word_timestamps, bool):
            raise FieldError("word_timestamps", f"must be true or false, got {self.word_timestamps!r}")
        if not isinstance(self.prompt, str) or len(self.prompt) > MAX_PROMPT_CHARS:
            raise FieldError("prompt", f"must be a string of at most {MAX_PROMPT_CHARS} characters")
        value = self.temperature
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise FieldError("temperature", f"must be a number in [0, 1], got {value!r}")
        if not isinstance(self.fitted_window, bool):
            raise FieldError("fitted_window", f"must be true or false, got {self.fitted_window!r}")
        if not isinstance(self.prefix, str) or len(self.prefix) > MAX_PROMPT_CHARS:
            raise FieldError("prefix", f"must be a string of at most {MAX_PROMPT_CHARS} characters")
        if self.prefix and not self.fitted_window:
            raise FieldError("prefix", "is only taken with fitted_window")
        if self.fitted_window and self.word_timestamps:
            raise FieldError("fitted_window", "gives no word timestamps; leave word_timestamps out")


def _decode_audio(value: Any) -> np.ndarray:
    """``(samples, rate)``, a path, encoded bytes or a data URL -> float32 mono at 16 kHz."""
    field = "prompt.multi_modal_data.audio"
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], int) or isinstance(value[1], bool) or value[1] <= 0:
            raise FieldError(field, "give (samples, sample_rate_hz) with a positive integer rate")
        audio, _ = load_audio(np.asarray(value[0]), WHISPER_RATE_HZ, source_rate_hz=value[1], max_seconds=MAX_AUDIO_S)
    elif isinstance(value, np.ndarray):
        raise FieldError(field, "raw samples need their rate: pass (samples, sample_rate_hz)")
    elif isinstance(value, (str, Path)):
        if (isinstance(value, Path) or not value.startswith("data:")) and not Path(value).is_file():
            raise FieldError(field, f"file not found: {value}")
        audio, _ = load_audio(value, WHISPER_RATE_HZ, max_seconds=MAX_AUDIO_S)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        audio, _ = load_audio(bytes(value), WHISPER_RATE_HZ, max_seconds=MAX_AUDIO_S)
    else:
        raise FieldError(field, f"expected (samples, rate), a path or encoded bytes, got {type(value).__name__}")
    if audio.size == 0:
        raise FieldError(field, "the audio is empty")
    return np.ascontiguousarray(audio, dtype=np.float32)


def _one_audio(value: Any) -> Any:
    """The spoken question: one audio, given alone or as a list of one (the chat route gives lists)."""
    if isinstance(value, list):
        if len(value) != 1:
            raise FieldError("prompt.multi_modal_data.audio", f"this pipeline takes one spoken question, got "
                             f"{len(value)} audio inputs")
        return value[0]
    return value


def _attached_images(value: Any) -> list[bytes]:
    field = "prompt.multi_modal_data.image"
    values = value if isinstance(value, list) else [value]
    if not values or len(values) > MAX_IMAGES:
        raise FieldError(field, f"give 1 to {MAX_IMAGES} images, got {len(values)}")
    return [encoded_image(v, f"{field}[{i}]" if isinstance(value, list) else field) for i, v in enumerate(values)]


def default_prompt(prompt: dict[str, Any]) -> EntryInput:
    audio = _one_audio(prompt["multi_modal_data"].get("audio"))
    image = prompt["multi_modal_data"].get("image")
    history = prompt.get("history") or []
    tools = prompt.get("tools") or []
    if image is not None:
        if audio is not None:
            raise FieldError("prompt.multi_modal_data.image", "an image goes with a written question; a spoken "
                             "question takes no attachment (send the question as text with the image)")
        if not prompt["prompt"].strip():
            raise FieldError("prompt.prompt", "an attached image needs a written question about it")
        return EntryInput("thinker", {"text": prompt["prompt"], "history": history, "tools": tools,
                                      "images": _attached_images(image)})
    if audio is None:
        return EntryInput("thinker", {"text": prompt["prompt"], "history": history, "tools": tools})
    return EntryInput("encoder", {"audio": _decode_audio(audio), "sample_rate_hz": WHISPER_RATE_HZ,
                                  "instruction": prompt["prompt"], "history": history, "tools": tools})


def tts_prompt(prompt: dict[str, Any]) -> EntryInput:
    return EntryInput("talker", {"text": prompt["prompt"]})


def asr_prompt(prompt: dict[str, Any]) -> EntryInput:
    return EntryInput("encoder", {"audio": _decode_audio(_one_audio(prompt["multi_modal_data"]["audio"])),
                                  "sample_rate_hz": WHISPER_RATE_HZ, "instruction": ""})


def encoder2thinker(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transcript (after any written instruction) becomes the thinker's question; the conversation before it
    goes along."""
    transcript = " ".join(t for o in outputs if (t := o.get("text", "").strip()))
    instruction = next((o.get("instruction", "") for o in outputs if o.get("instruction")), "")
    history: list[dict[str, Any]] = next((o["history"] for o in outputs if o.get("history")), [])
    tools: list[dict[str, Any]] = next((o["tools"] for o in outputs if o.get("tools")), [])
    return [{"text": f"{instruction} {transcript}".strip(), "history": history, "tools": tools}]


def first_sentence(text: str) -> tuple[str, str]:
    """``text`` cut after its first sentence of at least ``MIN_CLAUSE_WORDS`` words: (that sentence, the rest).
    The rest is empty when there is no such cut (one sentence, or no sentence end)."""
    for match in _SENTENCE_END.finditer(text):
        head, rest = text[: match.end()].strip(), text[match.end():].strip()
        if len(head.split()) >= MIN_CLAUSE_WORDS and rest:
            return head, rest
    return text.strip(), ""


def thinker2talker(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole answer, cut into the same pieces the streaming processor would have sent, so the talker speaks
    the same utterances whether or not async chunk is on (only the timing differs)."""
    text = "".join(o.get("text", "") for o in outputs).strip()
    state: dict[str, Any] = {}
    ctx = ChunkContext(SpokenPieceOptions(), active_requests=0, max_num_seqs=1)
    words = re.findall(r"\S+\s*", text)
    pieces: list[dict[str, Any]] = []
    for index, word in enumerate(words):
        pieces += thinker2talker_async_chunk(state, {"text": word}, index == len(words) - 1, ctx)
    return pieces


def speakable_cut(buffer: str, is_last: bool, first_chunk_words: int = 0) -> int:
    """How much of ``buffer`` to speak now: up to the last sentence end, else a clause end, else (for the first
    piece of an answer, ``first_chunk_words`` > 0) the first words, else nothing. The first piece is never shorter
    than ``first_chunk_words``, even at a sentence end: its audio is all the listener has while the next piece is
    made (a first piece of one or two words, "Rome, O.", ran dry at 4 sessions: ``bench voice``)."""
    if is_last:
        return len(buffer)
    sentence_ends = [m.end() for m in _SENTENCE_END.finditer(buffer)
                     if len(buffer[: m.end()].split()) >= first_chunk_words]
    if sentence_ends:
        return sentence_ends[-1]
    clause_ends = [m.end() for m in _CLAUSE_END.finditer(buffer) if len(buffer[: m.end()].split()) >= MIN_CLAUSE_WORDS]
    if clause_ends:
        return clause_ends[-1]
    words = buffer.split()
    if first_chunk_words and len(words) > first_chunk_words:
        # the last word may still be growing: cut before it once the first words are complete
        return buffer.rstrip().rfind(" ") + 1
    if len(words) > MAX_RUN_WORDS:
        return buffer.rstrip().rfind(" ") + 1
    return 0


def thinker2talker_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                               ctx: ChunkContext) -> list[dict[str, Any]]:
    """Stream text to the talker a sentence or clause at a time, as the thinker writes it."""
    state["buffer"] = state.get("buffer", "") + output.get("text", "")
    buffer: str = state["buffer"]
    options: SpokenPieceOptions = ctx.options
    first_words = 0 if state.get("sent") else options.first_chunk_words
    cut = speakable_cut(buffer, is_last, first_words)
    if cut <= 0:
        return []
    piece, state["buffer"] = buffer[:cut].strip(), buffer[cut:]
    if not piece:
        return []
    state["sent"] = True
    return [{"text": piece}]
