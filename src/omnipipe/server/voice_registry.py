"""Reference voices: voices made from a short uploaded clip (1 to 30 s), for a family whose speaking stages take a
speaker reference (``ServingTraits.reference_voice``). Each builds on one of the family's own voices (its
``base_voice``) and is kept on disk under ``{cache}/voices/{pipeline}/{name}/`` (the cache of ``util/cache.py``;
``clip``: the upload's bytes as sent; ``voice.json``: name, base voice, duration, the clip's SHA-256, creation time,
and the clip's transcript when the upload gave one), so it survives a restart. The disk is the registry: every lookup
reads it, so servers sharing a directory see each other's voices at once, and registering the same name with the same
clip, base voice and transcript again is answered with the voice already there (a gateway forwarding a registration to
every worker gets the same answer from each). What the reference stage takes (for Qwen2.5-Omni the clip's mel, for CSM
its codes and transcript) is made from the clip (and its transcript, given to the family's hook as ``text`` only when
there is one) when it is registered, or on its first use after a restart, and kept in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.util.cache import file_lock
from omnipipe.util.dotted import resolve
from omnipipe.util.field_error import FieldError
from omnipipe.util.media import load_audio

logger = logging.getLogger(__name__)

CLIP_RATE_HZ = 24_000  # the rate a clip is decoded at (the reference hook resamples where its family needs)
MIN_CLIP_S = 1.0
MAX_CLIP_S = 30.0
MAX_TEXT_CHARS = 2000  # a clip's transcript (30 s of speech is about 500 characters)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_CLIP_FILE = "clip"
_META_FILE = "voice.json"


class VoiceExistsError(Exception):
    """A voice of that name exists with another clip or base voice."""


@dataclass(frozen=True)
class ReferenceVoice:
    name: str
    base_voice: str
    duration_s: float
    sha256: str
    created_at: int
    text: str | None = None  # what the clip says (the upload's transcript); None: not given

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What the voice is made of: the clip's digest, the base voice and the transcript."""
        return self.sha256, self.base_voice, self.text


def check_transcript(text: str | None) -> str | None:
    """The transcript stripped (None when not given or blank); a FieldError naming ``text`` when it is too long."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if len(text) > MAX_TEXT_CHARS:
        raise FieldError("text", f"must be at most {MAX_TEXT_CHARS} characters (what the clip says), got {len(text)}")
    return text


def decode_clip(clip: bytes, field: str) -> np.ndarray:
    """The clip as float32 mono at ``CLIP_RATE_HZ``; a FieldError naming ``field`` when it is not audio or is not 1
    to 30 s long."""
    if not clip:
        raise FieldError(field, "is empty: upload a 1 to 30 s recording of the voice (wav, mp3, flac or ogg)")
    samples = load_audio(clip, field, CLIP_RATE_HZ)
    duration = len(samples) / CLIP_RATE_HZ
    if not MIN_CLIP_S <= duration <= MAX_CLIP_S:
        raise FieldError(field, f"must be {MIN_CLIP_S:g} to {MAX_CLIP_S:g} s of audio, got {duration:.2f} s")
    return samples


class VoiceRegistry:
    """The reference voices of one pipeline, kept in ``root``; ``options`` gives the deployed options of the stage
    the reference goes to (the hook reads its checkpoint from them)."""

    def __init__(self, root: Path, reference_voice: str, options: Callable[[], dict[str, Any]]) -> None:
        self.root = Path(root)
        self._hook = reference_voice
        self._options = options
        self._references: dict[tuple[str, str, str | None], Any] = {}  # ReferenceVoice.key -> the stage's value

    def voices(self) -> list[ReferenceVoice]:
        """Every voice kept, by name; a directory that cannot be read is logged and left out."""
        if not self.root.is_dir():
            return []
        found = []
        for meta in sorted(self.root.glob(f"*/{_META_FILE}")):
            if meta.parent.name.startswith("."):  # a voice being written
                continue
            try:
                found.append(ReferenceVoice(**json.loads(meta.read_text())))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("reference voice %s cannot be read: %s", meta.parent, exc)
        return found

    def get(self, name: str) -> ReferenceVoice | None:
        """The voice named ``name`` (any case)."""
        return next((v for v in self.voices() if v.name.casefold() == name.casefold()), None)

    def reference(self, voice: ReferenceVoice) -> Any:
        """What the reference stage's ``extra`` takes for ``voice`` (made from its clip once)."""
        if voice.key not in self._references:
            samples = decode_clip((self.root / voice.name / _CLIP_FILE).read_bytes(), "audio")
            self._references[voice.key] = self._made(samples, voice.text)
        return self._references[voice.key]

    def _made(self, samples: np.ndarray, text: str | None) -> Any:
        """The hook's value for a clip; its transcript passed (as ``text``) only when there is one, so a hook that
        takes none is called as before (the route refuses a transcript for such a family)."""
        extra = {} if text is None else {"text": text}
        return resolve(self._hook)(self._options(), samples, CLIP_RATE_HZ, **extra)

    def add(self, name: str, clip: bytes, base_voice: str, text: str | None = None) -> tuple[ReferenceVoice, bool]:
        """Keep a new voice (its clip and transcript ``text`` checked and its reference made first): (the voice,
        whether it is new). The same name, clip, base voice and transcript again return the voice kept; another
        under a kept name raises ``VoiceExistsError``."""
        text = check_transcript(text)
        samples = decode_clip(clip, "audio")
        digest = hashlib.sha256(clip).hexdigest()
        reference = self._made(samples, text)
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / ".lock"):
            kept = self.get(name)
            if kept is not None:
                if kept.key == (digest, base_voice, text):
                    return kept, False
                raise VoiceExistsError(f"voice {kept.name!r} exists (base voice {kept.base_voice!r}, another clip or "
                                       "transcript); delete it first or choose another name")
            voice = ReferenceVoice(name, base_voice, round(len(samples) / CLIP_RATE_HZ, 3), digest, int(time.time()),
                                   text)
            staging = self.root / f".{name}.{digest[:12]}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            (staging / _CLIP_FILE).write_bytes(clip)
            (staging / _META_FILE).write_text(json.dumps(asdict(voice)))
            staging.rename(self.root / name)
        self._references[voice.key] = reference
        return voice, True

    def delete(self, name: str) -> ReferenceVoice | None:
        """Remove the voice named ``name`` (any case): the voice removed, or None when there was none."""
        if not self.root.is_dir():
            return None
        with file_lock(self.root / ".lock"):
            voice = self.get(name)
            if voice is not None:
                shutil.rmtree(self.root / voice.name)
        return voice


def valid_name(name: str) -> str:
    """``name`` stripped, if it can name a voice (and a directory); else a FieldError naming ``name``."""
    name = name.strip()
    if not NAME_PATTERN.fullmatch(name):
        raise FieldError("name", f"must be 1 to 64 letters, digits, '_', '-' or '.', starting with a letter or "
                         f"digit, got {name!r}")
    return name
