"""A realtime session's conversation: its items (user, system and assistant messages, spoken or typed; the
model's function calls and the client's outputs for them), ``conversation.item.create`` / ``.truncate`` /
``.delete`` / ``.retrieve``, and the turn the next response answers with the history before it (a call is the
assistant turn's ``tool_calls``, its output a ``tool`` turn after it)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.protocol.realtime import (
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    ServerEvent,
)
from omnipipe.server.realtime_settings import part_type
from omnipipe.server.routes.realtime.checks import check_image_part, check_takes_audio, decode_pcm16
from omnipipe.server.routes.realtime.events import EventError, new_item_id
from omnipipe.server.routes.realtime.frames import Frame
from omnipipe.server.tool_calls import new_call_id

if TYPE_CHECKING:
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.server.realtime_settings import Settings
    from omnipipe.server.routes.realtime.events import Send
    from omnipipe.server.routes.realtime.frames import CameraFrames
    from omnipipe.server.routes.realtime.idle import IdleWatch


@dataclass
class ConversationItem:
    """One item of the conversation: its words (what the history gives the thinker) and how the client sees it."""

    id: str
    role: str  # user | assistant | system (a function call: assistant; its output: tool)
    words: str = ""  # text, or the transcript of spoken audio (empty until transcribed)
    audio: np.ndarray | None = None  # a user item's spoken part (24 kHz)
    # the same audio at 16 kHz, streamed into the pipeline while it was spoken (``AsyncOmni.append_audio``) under
    # this id, for the turn's prompt to name instead of the clip; used once (None once the turn is taken)
    audio_stream: str | None = None
    audio_ms: float = 0.0  # an assistant item's audio sent
    spoken: bool = False  # the item's content is audio (a transcript beside it)
    text_part: str | None = None  # a user item's typed part, beside its audio
    images: list[str] = field(default_factory=list)  # a user item's images (data URLs, checked), in order
    frames: list[Frame] = field(default_factory=list)  # a pending user item's camera frames (sampled)
    frame_times: list[float] = field(default_factory=list)  # the capture times of the camera frames it took
    status: str = "completed"
    pending: bool = False  # a user item no response has answered yet
    transcribed: bool = False  # a spoken user item whose words were heard live: the turn gives them, not its audio
    type: str = "message"  # message | function_call | function_call_output
    call_id: str = ""  # a function call's id, or the call a function_call_output answers
    name: str = ""  # a function call's function
    arguments: str = ""  # a function call's arguments (JSON text)
    output: str = ""  # a function_call_output's output
    response_id: str | None = None  # the response that made an assistant item
    idle: bool = False  # the silence server VAD's idle_timeout_ms committed: the thinker is told the user said nothing
    speech_end: tuple[float, str] | None = None  # a committed item: when the speech ended (perf_counter) and what
    # ended the turn (the commit, or the VAD), from the event that ended it

    def call(self) -> dict[str, str] | None:
        """A completed function call as the prompt's history takes it (``{"id", "name", "arguments"}``); None for
        one cut off or whose arguments are not a JSON object."""
        if self.type != "function_call" or self.status != "completed":
            return None
        try:
            arguments = json.loads(self.arguments)
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        return {"id": self.call_id, "name": self.name, "arguments": self.arguments}

    def take_frames(self, frames: list[Frame]) -> None:
        self.frames = frames
        self.frame_times = [frame.captured_at_ms for frame in frames]

    def wire(self, dialect: str) -> dict[str, Any]:
        base = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "function_call":
            return {**base, "call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type == "function_call_output":
            return {**base, "call_id": self.call_id, "output": self.output}
        content: list[dict[str, Any]]
        if self.role == "assistant":
            kind = part_type(dialect, self.spoken)
            content = [{"type": kind, "transcript": self.words} if self.spoken else {"type": kind, "text": self.words}]
        elif self.spoken:
            content = [{"type": "input_audio", "transcript": self.words or None}]
            if self.text_part:
                content.insert(0, {"type": "input_text", "text": self.text_part})
        else:
            content = [{"type": "input_text", "text": self.words}] if self.words else []
        content += [{"type": "input_image", "image_url": url} for url in self.images]
        content += [{"type": "input_image", "captured_at_ms": at} for at in self.frame_times]
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status,
                "role": self.role, "content": content}


@dataclass
class Turn:
    """What the next response answers: texts and spoken audio (24 kHz float32) of the pending user items."""

    texts: list[str] = field(default_factory=list)
    audio: np.ndarray | None = None
    audio_stream: str | None = None  # the audio's stream, when it is one item's audio that streamed in
    images: list[str] = field(default_factory=list)  # data URLs
    frames: list[Frame] = field(default_factory=list)  # camera frames, by capture time
    heard: bool = False  # spoken words transcribed live are among the texts
    speech_end: tuple[float, str] | None = None  # the last committed item's end of speech and what ended it


# what the thinker is given for a silence that server VAD's idle_timeout_ms committed (its transcript stays empty):
# the model then speaks up (the packaged thinker: "Hello! How can I assist you today?"), as OpenAI's does
IDLE_TURN_TEXT = "(silence)"

# the content part types each role's item takes in conversation.item.create
ALLOWED_CONTENT = {"user": ("input_text", "input_audio", "input_image"), "system": ("input_text",),
                   "assistant": ("output_text", "output_audio", "text", "audio")}


class Conversation:
    """The session's items in order; items are only ever added at the end. ``settings``: the session's (its
    instructions), changed in place by ``session.update``; ``pipeline`` and ``dialect``: the session's; ``idle``: the
    idle watch (an item is activity); ``frames``: the camera frames a user item takes; ``transcribe``: start the
    transcription of a spoken user item that joins; ``answering``: whether an item is the running response's (it may
    not be changed); ``drop_stream``: forget an audio stream in the pipeline (an item's that no turn will take);
    ``send``: the session's events."""

    def __init__(self, settings: Settings, pipeline: PipelineSpec, dialect: str, *, idle: IdleWatch,
                 frames: CameraFrames, transcribe: Callable[[ConversationItem], None],
                 answering: Callable[[ConversationItem], bool], drop_stream: Callable[[str], Awaitable[None]],
                 send: Send) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.dialect = dialect
        self.idle = idle
        self.frames = frames
        self.transcribe = transcribe
        self.answering = answering
        self.drop_stream = drop_stream
        self.send = send
        self.items: list[ConversationItem] = []

    def last_item_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def has_pending(self) -> bool:
        return any(item.pending for item in self.items)

    def find(self, item_id: str, param: str = "item_id") -> ConversationItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise EventError(f"{param}: no item {item_id!r} in the conversation", param, code="item_not_found")

    async def add(self, item: ConversationItem) -> None:
        """Append an item and announce it (``conversation.item.added`` and ``.done``; beta ``.created``)."""
        self.idle.touch()
        previous = self.last_item_id()
        self.items.append(item)
        await self.send(ServerEvent.CONVERSATION_ITEM_ADDED, previous_item_id=previous, item=item.wire(self.dialect))
        if item.status == "completed":
            await self.send(ServerEvent.CONVERSATION_ITEM_DONE, previous_item_id=previous,
                            item=item.wire(self.dialect))
        if item.role == "user" and item.spoken:
            self.transcribe(item)

    async def create(self, event: ConversationItemCreate) -> None:
        item = event.item
        pipeline = self.pipeline
        if event.previous_item_id is not None and event.previous_item_id != self.last_item_id():
            raise EventError("previous_item_id: items can only be added at the end of the conversation (leave it "
                             "out, or give the last item's id)", "previous_item_id", code="unsupported_parameter")
        if item.id is not None and any(existing.id == item.id for existing in self.items):
            raise EventError(f"item.id: an item {item.id!r} already exists", "item.id", code="duplicate_item_id")
        fields = {"message": ("role", "content"), "function_call": ("call_id", "name", "arguments"),
                  "function_call_output": ("call_id", "output")}
        for name in ("role", "content", "call_id", "name", "arguments", "output"):
            given = getattr(item, name) is not None
            if given and name not in fields[item.type]:
                raise EventError(f"item.{name}: not a field of a {item.type} item", f"item.{name}",
                                 code="unknown_parameter")
            if not given and name in fields[item.type] and not (name == "call_id" and item.type == "function_call"):
                raise EventError(f"item.{name}: required for a {item.type} item", f"item.{name}",
                                 code="missing_field")
        if item.type == "function_call_output":
            await self._call_output(item)
            return
        if item.type == "function_call":
            await self._call(item)
            return
        if item.role != "user" and not pipeline.takes_history:
            raise EventError(f"item.role: pipeline {pipeline.name!r} answers one question at a time; only "
                             "'user' items are supported", "item.role", code="unsupported_item")
        texts, audio, images = self._content(item)
        text = " ".join(texts)
        if not text and audio is None:
            raise EventError("item.content: the message has no text" + (" beside its images" if images else ""),
                             "item.content")
        if item.role == "user" and text and "text" not in pipeline.input_modalities:
            raise EventError(f"item.content: pipeline {pipeline.name!r} does not take text input",
                             "item.content", code="unsupported_modality")
        spoken = audio is not None or (item.role == "assistant" and
                                       any(p.type in ("output_audio", "audio") for p in item.content))
        new = ConversationItem(item.id or new_item_id(), item.role, spoken=spoken, pending=item.role == "user",
                               audio=audio, images=images)
        if item.role == "user":
            new.take_frames(self.frames.take(len(images)))
        if audio is not None:
            new.text_part = text or None
        else:
            new.words = text
        await self.add(new)

    async def _call(self, item: Any) -> None:
        """A function call the client puts in the conversation (as if the model had made it)."""
        pipeline = self.pipeline
        if not pipeline.takes_history:
            raise EventError(f"item.type: pipeline {pipeline.name!r} answers one question at a time; only "
                             "'user' items are supported", "item.type", code="unsupported_item")
        try:
            arguments = json.loads(item.arguments)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise EventError("item.arguments: must be a JSON object's text", "item.arguments")
        call_id = item.call_id or new_call_id()
        if any(existing.type == "function_call" and existing.call_id == call_id for existing in self.items):
            raise EventError(f"item.call_id: a function call {call_id!r} already exists", "item.call_id",
                             code="duplicate_item_id")
        await self.add(ConversationItem(item.id or new_item_id(), "assistant", type="function_call",
                                        call_id=call_id, name=item.name, arguments=item.arguments))

    async def _call_output(self, item: Any) -> None:
        """The output of an earlier function call: the next response goes on from it."""
        call = next((existing for existing in self.items
                     if existing.type == "function_call" and existing.call_id == item.call_id), None)
        if call is None:
            raise EventError(f"item.call_id: no function_call item with call_id {item.call_id!r} in the "
                             "conversation", "item.call_id", code="invalid_value")
        if call.call() is None:
            raise EventError(f"item.call_id: the function call {item.call_id!r} was cut off before its arguments "
                             "were complete; it cannot be answered", "item.call_id", code="invalid_value")
        await self.add(ConversationItem(item.id or new_item_id(), "tool", type="function_call_output",
                                        call_id=item.call_id, output=item.output, pending=True))

    def _content(self, item: Any) -> tuple[list[str], np.ndarray | None, list[str]]:
        """A created item's content parts, checked in order: their texts, their audio (joined), their images."""
        allowed = ALLOWED_CONTENT[item.role]
        texts: list[str] = []
        audio: np.ndarray | None = None
        images: list[str] = []
        for i, part in enumerate(item.content):
            param = f"item.content[{i}]"
            if part.type not in allowed:
                raise EventError(f"{param}.type: a {item.role} item takes {', '.join(allowed)} content, got "
                                 f"{part.type!r}", f"{param}.type", code="unsupported_content")
            if part.type == "input_audio":
                if part.audio is None:
                    raise EventError(f"{param}.audio: required for input_audio content", f"{param}.audio",
                                     code="missing_field")
                check_takes_audio(self.pipeline, f"{param}.audio")
                samples = decode_pcm16(part.audio, f"{param}.audio")
                if samples.size == 0:
                    raise EventError(f"{param}.audio: the audio is empty", f"{param}.audio")
                audio = samples if audio is None else np.concatenate([audio, samples])
            elif part.type == "input_image":
                images.append(check_image_part(self.pipeline, part.image_url, f"{param}.image_url", len(images)))
            else:
                value = part.text if part.type in ("input_text", "output_text", "text") else part.transcript
                if value is not None and value.strip():
                    texts.append(value.strip())
        return texts, audio, images

    def _check_not_answering(self, item: ConversationItem) -> None:
        if self.answering(item):
            raise EventError("item_id: the item's response is still running; cancel it first", "item_id",
                             code="invalid_item")

    async def truncate(self, event: ConversationItemTruncate) -> None:
        """Cut an assistant audio item's words to what was heard by ``audio_end_ms`` (the talker speaks at an even
        pace, so the words in proportion to the audio)."""
        item = self.find(event.item_id)
        if item.role != "assistant" or not item.spoken:
            raise EventError("item_id: only an assistant item with audio can be truncated", "item_id",
                             code="invalid_item")
        self._check_not_answering(item)
        if event.audio_end_ms > item.audio_ms + 1:
            raise EventError(f"audio_end_ms: the item has {item.audio_ms:.0f} ms of audio, got {event.audio_end_ms}",
                             "audio_end_ms")
        words = item.words.split()
        keep = round(len(words) * event.audio_end_ms / item.audio_ms) if item.audio_ms else 0
        item.words = " ".join(words[:keep])
        item.audio_ms = float(event.audio_end_ms)
        await self.send(ServerEvent.CONVERSATION_ITEM_TRUNCATED, item_id=item.id, content_index=event.content_index,
                        audio_end_ms=event.audio_end_ms)

    async def delete(self, event: ConversationItemDelete) -> None:
        item = self.find(event.item_id)
        self._check_not_answering(item)
        self.items.remove(item)
        if item.audio_stream is not None:  # its audio streamed into the pipeline, and no turn will take it now
            await self.drop_stream(item.audio_stream)
            item.audio_stream = None
        await self.send(ServerEvent.CONVERSATION_ITEM_DELETED, item_id=item.id)

    async def retrieve(self, event: ConversationItemRetrieve) -> None:
        item = self.find(event.item_id)
        await self.send(ServerEvent.CONVERSATION_ITEM_RETRIEVED, item=item.wire(self.dialect))

    async def take_turn(self) -> tuple[Turn, list[dict[str, Any]]]:
        """The pending user items as the turn (no longer pending), and every other item before them as the
        history. Streamed audio the turn's prompt does not name (two clips go whole) is forgotten in the pipeline."""
        turn, history = self.peek_turn()
        for item in self.items:
            item.pending = False
            item.frames = []  # the turn has them; the item keeps their times
            stream, item.audio_stream = item.audio_stream, None  # the turn's prompt takes it, or no one will
            if stream is not None and stream != turn.audio_stream:
                await self.drop_stream(stream)
        return turn, history

    def peek_turn(self, *more: ConversationItem) -> tuple[Turn, list[dict[str, Any]]]:
        """What ``take_turn`` would give were ``more`` items added first, changing nothing (a tentative answer's
        question: the speech not yet committed)."""
        turn = Turn()
        history: list[dict[str, Any]] = []
        instructions = self.settings.instructions.strip()
        if instructions:
            history.append({"role": "system", "content": instructions})
        calls: set[str] = set()  # the calls the history holds
        made_by: str | None = None  # the response whose assistant turn ends the history
        for item in (*self.items, *more):
            if item.type == "function_call":
                call = item.call()
                if call is None:
                    continue
                calls.add(call["id"])
                last = history[-1] if history else None
                if last is not None and last["role"] == "assistant" and item.response_id is not None \
                        and made_by == item.response_id:
                    last.setdefault("tool_calls", []).append(call)
                else:
                    history.append({"role": "assistant", "content": "", "tool_calls": [call]})
                made_by = item.response_id
                continue
            made_by = None
            if item.type == "function_call_output":
                if item.call_id in calls:
                    history.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
                continue
            if item.pending:
                turn.images += item.images
                turn.frames += item.frames
                if item.text_part:
                    turn.texts.append(item.text_part)
                if item.words and (item.transcribed or not item.spoken):
                    turn.texts.append(item.words)
                elif item.idle:
                    turn.texts.append(IDLE_TURN_TEXT)
                turn.heard = turn.heard or item.transcribed
                turn.speech_end = item.speech_end or turn.speech_end
                if item.audio is not None and not item.transcribed:
                    turn.audio_stream = item.audio_stream if turn.audio is None else None  # two clips: whole
                    turn.audio = item.audio if turn.audio is None else np.concatenate([turn.audio, item.audio])
            elif item.words:
                history.append({"role": item.role, "content": item.words})
                made_by = item.response_id if item.role == "assistant" else None
        return turn, history
