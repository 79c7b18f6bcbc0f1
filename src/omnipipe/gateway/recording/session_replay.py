"""The replays of a saved session, made from the files its ``recording.json`` names: ``merged_replay.wav`` (when it
has audio) and ``merged_replay.mp4`` (when it has camera frames: the frames as video with the same audio).

The recorder writes them when a session ends; the cleanup writes them for a session a crash cut (``cut_sessions``).
"""

from __future__ import annotations

import logging
import wave
from pathlib import Path
from typing import Any

from omnipipe.gateway.recording.replay import REPLAY_RATE_HZ, Clip, read_wav, write_merged_replay
from omnipipe.gateway.recording.store import REPLAY_FILENAME, VIDEO_REPLAY_FILENAME
from omnipipe.gateway.recording.user_frames import frames_on_timeline
from omnipipe.gateway.recording.video_replay import VIDEO_REPLAY_FPS, write_video_replay
from omnipipe.util.audio import load_audio

logger = logging.getLogger(__name__)


def replay_clips(turns: list[dict[str, Any]]) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """``(t_start, relpath)`` of every user and every AI clip of a recording's ``turns``."""
    user: list[tuple[float, str]] = []
    ai: list[tuple[float, str]] = []
    for turn in turns:
        first_user_clip = [turn["user_audio"]] if turn.get("user_audio") is not None else []
        user.extend((entry["t_start"], entry["path"]) for entry in first_user_clip + turn.get("user_audio_extra", []))
        ai.extend((entry["t_start"], entry["path"]) for entry in turn.get("ai_audio", []))
    return user, ai


def _load_clip(directory: Path, t_start: float, relpath: str, session_id: str) -> Clip | None:
    """A saved clip for the replay: our own WAVs directly, other files through ``load_audio``."""
    path = directory / relpath
    try:
        samples, rate = read_wav(path)
    except (wave.Error, EOFError, OSError):
        try:
            samples, rate = load_audio(path)
        except Exception as exc:  # noqa: BLE001 - an undecodable file is left out of the replay
            logger.warning("session %s: %s left out of the replay (%s)", session_id, relpath, exc)
            return None
    return float(t_start), samples, int(rate)


def timeline_end(recording: dict[str, Any]) -> float:
    """The last moment ``recording`` mentions (seconds since the session start): a turn's end, the end of a clip, an
    event, a frame's 1/4 s."""
    times: list[float] = []
    for turn in recording.get("turns", []):
        times += [turn.get("started_at"), turn.get("ended_at")]
        clips = [turn.get("user_audio"), *turn.get("user_audio_extra", []), *turn.get("ai_audio", [])]
        times += [clip["t_start"] + clip.get("duration_s", 0.0) for clip in clips if isinstance(clip, dict)]
    times += [event.get("t") for event in recording.get("events", [])]
    times += [frame["t"] + 1.0 / VIDEO_REPLAY_FPS for frame in recording.get("frames", [])]
    return max((float(t) for t in times if isinstance(t, (int, float))), default=0.0)


def write_session_replays(directory: Path, recording: dict[str, Any], *, duration_s: float, max_duration_s: float,
                          session_id: str) -> None:
    """Write the replays of the session in ``directory`` whose ``recording.json`` is ``recording`` (``duration_s``:
    the session's length, which the video replay spans); nothing for a session with neither readable audio nor
    frames."""
    user_clips, ai_clips = replay_clips(recording.get("turns", []))
    user = [clip for clip in (_load_clip(directory, *c, session_id) for c in user_clips) if clip is not None]
    ai = [clip for clip in (_load_clip(directory, *c, session_id) for c in ai_clips) if clip is not None]
    if user or ai:
        write_merged_replay(directory / REPLAY_FILENAME, user, ai, REPLAY_RATE_HZ, max_duration_s=max_duration_s)
    frames = frames_on_timeline(recording.get("frames", []), directory)
    if frames:
        write_video_replay(directory / VIDEO_REPLAY_FILENAME, frames, user, ai, duration_s=duration_s,
                           max_duration_s=max_duration_s)
