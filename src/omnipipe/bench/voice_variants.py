"""The variants ``omnipipe bench voice`` compares side by side: a name, what it changes, and how: settings merged
over the server's deploy file (a variant with its own deploy gets a server of its own) and fields merged into every
session's ``session.update``. Adding a feature switch to the comparison is one line in ``VARIANTS``."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from omnipipe.config.deploy_config import merge_settings
from omnipipe.protocol.realtime import ClientEvent

COMMIT, SERVER_VAD, SEMANTIC_VAD = "commit", "server_vad", "semantic_vad"
MODES = (COMMIT, SERVER_VAD, SEMANTIC_VAD)


@dataclass(frozen=True)
class Variant:
    name: str
    about: str
    deploy: dict[str, Any] = field(default_factory=dict)  # merged over the server's deploy file
    session: dict[str, Any] = field(default_factory=dict)  # merged into each session.update's ``session``
    camera_fps: float = 0.0  # camera frames a second sent beside the microphone (``input_video_frame.append``)

    @property
    def deploy_key(self) -> str:
        """Variants with equal keys share a server."""
        return json.dumps(self.deploy, sort_keys=True)


_NO_LIVE = {"audio": {"input": {"live_transcription": False}}}
_NO_SPECULATION = {"audio": {"input": {"turn_detection": {"speculative_start": False}}}}
_NO_PREFIX_CACHE = {"stages": {"thinker": {"options": {"prefix_cache_bytes": 0}}}}
_FIRST_PIECE_2 = {"edges": {"thinker->talker": {"options": {"first_chunk_words": 2}}}}
_FIRST_CHUNK_5 = {"edges": {"talker->code2wav": {"options": {"initial_codec_chunk_frames": 5}}}}
_NO_AUDIO_STREAM = {"stages": {"thinker": {"options": {"audio_streams": 0}}}}
_DEADLINE = {"stages": {name: {"options": {"schedule": "deadline"}} for name in ("talker", "code2wav")}}

VARIANTS: tuple[Variant, ...] = (
    Variant("baseline", "the voice turn as the server has it"),
    Variant("no-live", "the committed audio transcribed whole by the pipeline", session=_NO_LIVE),
    Variant("no-speculation", "server VAD answers only once its silence window closes", session=_NO_SPECULATION),
    Variant("no-prefix-cache", "the thinker prefills the whole conversation every turn", deploy=_NO_PREFIX_CACHE),
    Variant("first-piece-2", "the talker's first piece is 2 words (default 4)", deploy=_FIRST_PIECE_2),
    Variant("first-chunk-5", "the first audio chunk is 5 frames, 58 ms (default 10)", deploy=_FIRST_CHUNK_5),
    Variant("no-audio-stream", "a thinker that hears audio (Qwen-Omni) gets each turn's clip whole at its end, "
            "not streamed in while the user speaks", deploy=_NO_AUDIO_STREAM),
    Variant("deadline", "talker and vocoder serve the stream whose playback runs dry soonest", deploy=_DEADLINE),
    Variant("camera", "a 640x480 JPEG camera frame each second beside the microphone, as the omni page sends: the "
            "turn's frames go to the thinker with its words", camera_fps=1.0),
    Variant("none", "without live transcription, speculation or the prefix cache: the voice turn as it was",
            session=merge_settings(_NO_LIVE, _NO_SPECULATION), deploy=_NO_PREFIX_CACHE),
)


def parse_variants(value: str, known: tuple[Variant, ...] = VARIANTS) -> list[Variant]:
    """``"baseline,x"`` -> those variants in that order (``all``: every one); ValueError naming the flag."""
    by_name = {v.name: v for v in known}
    names = [n.strip() for n in value.split(",") if n.strip()]
    if names == ["all"]:
        return list(known)
    if not names:
        raise ValueError("--variants: a comma-separated list of variant names, or 'all'")
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"--variants: unknown {', '.join(map(repr, unknown))} (known: {', '.join(by_name)})")
    return [by_name[n] for n in dict.fromkeys(names)]


def session_update(mode: str, max_tokens: int, variant: Variant) -> dict[str, Any]:
    """The ``session.update`` a session of ``variant`` sends: spoken answers, the token limit, the turn detection
    of ``mode`` (none: the client commits; server VAD or semantic VAD at its defaults, eagerness auto), then the
    variant's own fields."""
    detection = None if mode == COMMIT else {"type": mode}
    session = {"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": max_tokens,
               "audio": {"input": {"turn_detection": detection}}}
    own = copy.deepcopy(variant.session)
    if mode == COMMIT:  # the variant's VAD knobs only where there is a VAD
        own.get("audio", {}).get("input", {}).pop("turn_detection", None)
    return {"type": ClientEvent.SESSION_UPDATE, "session": merge_settings(session, own)}
