"""The parts of a realtime session (``server/routes/realtime/``) hold no session object: no part's constructor takes
the session, and no part of a live ``RealtimeSession`` (nor any part a part holds, such as the turn controller's
buffer, VAD, live transcript and audio stream) has the session among its attributes. The parts that read the
settings share the session's own settings object, which ``session.update`` changes in place."""

from __future__ import annotations

import inspect
import re
from collections import deque
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from omnipipe.server.engines import ServerConfig
from omnipipe.server.routes.realtime.audio_buffer import InputAudioBuffer
from omnipipe.server.routes.realtime.conversation import Conversation
from omnipipe.server.routes.realtime.frames import CameraFrames
from omnipipe.server.routes.realtime.idle import IdleWatch
from omnipipe.server.routes.realtime.live_transcript import LiveTranscript
from omnipipe.server.routes.realtime.pause import SessionPause
from omnipipe.server.routes.realtime.response import Responses
from omnipipe.server.routes.realtime.session import RealtimeSession
from omnipipe.server.routes.realtime.speculative_start import TentativeAnswer
from omnipipe.server.routes.realtime.transcription import Transcriptions, transcribe
from omnipipe.server.routes.realtime.turn import AudioStream, TurnController

PARTS: list[Callable[..., Any]] = [SessionPause, IdleWatch, CameraFrames, Transcriptions, transcribe, Conversation,
                                   Responses, TurnController, InputAudioBuffer, LiveTranscript, AudioStream,
                                   TentativeAnswer]
# a type that stands for the session: the session's class, or a Protocol of what a part uses of it
SESSION_TYPE = re.compile(r"\b(\w+Session|SessionCore)\b")


@pytest.mark.parametrize("part", PARTS, ids=lambda part: part.__name__)
def test_no_part_is_given_the_session(part: Callable[..., Any]) -> None:
    for name, parameter in inspect.signature(part).parameters.items():
        assert name != "session", f"{part.__name__} takes the session"
        annotation = parameter.annotation if isinstance(parameter.annotation, str) else repr(parameter.annotation)
        assert not SESSION_TYPE.search(annotation), f"{part.__name__}'s {name} is the session: {annotation}"


def realtime_session() -> RealtimeSession:
    """A session on the default pipeline, its connection, engine and metrics stand-ins (building one reaches none of
    them)."""
    from omnipipe.models.default.pipeline import DEFAULT

    pool: Any = SimpleNamespace(config=ServerConfig(), endpoint_pipelines={"transcription": "asr"},
                                model_name="default")
    websocket: Any = SimpleNamespace()
    engine: Any = SimpleNamespace(deploy=None)
    metrics: Any = SimpleNamespace()
    return RealtimeSession(websocket, engine, DEFAULT, pool, metrics)


def held(value: Any) -> Iterator[Any]:
    """``value``, or what a container holds."""
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list | tuple | set | frozenset | deque):
        yield from value
    else:
        yield value


def parts_of(session: RealtimeSession) -> dict[str, Any]:
    """Every part the session holds, and every part those hold, by where it is found (``turn.live``): the objects
    of ``omnipipe.server`` classes reached through their attributes, each by its shortest way there."""
    found: dict[str, Any] = {}
    seen = {id(session)}
    waiting = deque(vars(session).items())
    while waiting:
        where, value = waiting.popleft()
        for part in held(value):
            if id(part) in seen or not type(part).__module__.startswith("omnipipe.server.") \
                    or not hasattr(part, "__dict__"):
                continue
            seen.add(id(part))
            found[where] = part
            waiting += [(f"{where}.{name}", attribute) for name, attribute in vars(part).items()]
    return found


def test_no_part_of_a_live_session_holds_the_session() -> None:
    session = realtime_session()
    parts = parts_of(session)
    assert {"pause", "idle", "frames", "transcriptions", "conversation", "responses", "turn", "turn.buffer",
            "turn.vad", "turn.live", "turn.stream"} <= set(parts), sorted(parts)
    for where, part in parts.items():
        for name, value in vars(part).items():
            assert not any(item is session for item in held(value)), f"{where}.{name} is the session"
        if hasattr(part, "settings"):  # the session's own, which session.update changes in place
            assert part.settings is session.settings, f"{where}.settings is not the session's"
