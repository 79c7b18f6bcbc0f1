"""A realtime session's responses, one at a time: ``response.create`` (the pending user items as the turn, the
conversation before them as history), the answer streamed through the engine with the events of its item and
content part (``response.created`` ... ``response.done``), and ``response.cancel`` (also a barge-in, a pause or a
disconnect): a cancelled answer closes its part and item too and keeps the words it sent. A spoken turn's first
answer audio is timed from the end of the user's speech (``omnipipe:realtime_speech_end_to_first_audio_seconds``),
and the answer's audio is played on a clock at real-time pace that counts its gaps
(``omnipipe:realtime_playback_underruns``). An answer started ahead of the turn's end (``speculative_start.py``)
is taken by the response of that turn as it is, plan and stream. When an answer ends, the response tells whoever
made it (``answered``: the turn controller) when its audio will have played out.

With tools offered, the answer's output items open as they come: its message when its first words or audio
arrive, a ``function_call`` item when the model names a function (``response.function_call_arguments.delta`` /
``.done`` carry its arguments). A call is never spoken: audio that comes with calls and no words is dropped."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.protocol.realtime import BetaResponseOptions, ResponseCancel, ResponseCreate, ResponseOptions, ServerEvent
from omnipipe.protocol.worker import REALTIME_PATH
from omnipipe.server.audio_stream import Pcm16Stream
from omnipipe.server.engines import with_voice
from omnipipe.server.errors import from_engine_error
from omnipipe.server.realtime_settings import output_modalities_field, response_object
from omnipipe.server.routes.realtime.checks import check_modalities, check_sampling
from omnipipe.server.routes.realtime.conversation import ConversationItem, Turn
from omnipipe.server.routes.realtime.events import EventError, Send, SendError, new_item_id
from omnipipe.server.routes.realtime.frames import frames_media
from omnipipe.server.tool_calls import ToolCalls
from omnipipe.util.playback_clock import PlaybackClock

if TYPE_CHECKING:
    from omnipipe.api.async_omni import AsyncOmni
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.server.engines import EnginePool
    from omnipipe.server.prometheus import ServerMetrics
    from omnipipe.server.realtime_settings import Settings
    from omnipipe.server.routes.realtime.conversation import Conversation
    from omnipipe.server.routes.realtime.idle import IdleWatch
    from omnipipe.server.routes.realtime.pause import SessionPause


@dataclass(frozen=True)
class AnswerPlan:
    """What the engine is asked for one turn, and how its errors name the client's fields."""

    prompt: dict[str, Any]
    modalities: list[str]
    sampling: dict[str, SamplingParams] | None
    fields: dict[str, str]  # the engine's field -> the client's
    max_output_tokens: int | str
    spoken_turn: bool  # the turn was spoken (its first answer audio is timed from the end of speech)
    calls: bool = False  # the model may call the session's tools (its output items open as they come)


@dataclass
class _Answer:
    """A running response's answer: its assistant item and what has been sent of it so far."""

    response_id: str
    item: ConversationItem
    text_parts: list[str] = field(default_factory=list)
    audio_samples: int = 0  # pcm16 samples at 24 kHz sent
    pcm: Pcm16Stream | None = None
    final: OmniRequestOutput | None = None  # the engine's finished output
    speech_end: tuple[float, str] | None = None  # the spoken turn's end of speech (perf_counter) and what ended it
    playback: PlaybackClock = field(default_factory=PlaybackClock)  # the audio sent, played from its first chunk
    outputs: list[ConversationItem] = field(default_factory=list)  # the response's output items, in order
    calls: ToolCalls = field(default_factory=ToolCalls)
    call_items: dict[int, ConversationItem] = field(default_factory=dict)  # by the call's index
    held: list[str] = field(default_factory=list)  # blank text before the message opened (dropped if it never does)

    @property
    def base(self) -> dict[str, Any]:
        """The fields every event of the answer's content part carries."""
        return {"response_id": self.response_id, "item_id": self.item.id, "output_index": self.index(self.item),
                "content_index": 0}

    def index(self, item: ConversationItem) -> int:
        return self.outputs.index(item) if item in self.outputs else len(self.outputs)

    @property
    def message_open(self) -> bool:
        return self.item in self.outputs

    def part(self, words: str) -> dict[str, str]:
        """The content part in ``response.content_part.added`` / ``.done``."""
        return {"type": "audio", "transcript": words} if self.item.spoken else {"type": "text", "text": words}


class AnswerAhead(Protocol):
    """An answer started ahead of its turn (``speculative_start.TentativeAnswer``), as the turn's response takes
    it."""

    @property
    def response_id(self) -> str: ...

    async def adopt(self) -> tuple[AnswerPlan, AsyncIterator[OmniRequestOutput]] | None:
        """The answer's plan and stream (None, and the answer dropped, when it failed to start)."""


class Responses:
    """The session's response in progress (at most one): its task, id and assistant item. ``settings``: the
    session's, changed in place by ``session.update``; ``pipeline``, ``engine``, ``session_id`` and ``dialect``: the
    session's; ``pool`` and ``metrics``: the server's; ``pause``: the session's pause (a paused session answers
    nothing); ``conversation``: the items answered and those the answer adds; ``idle``: the idle watch (an answer's
    end is activity); ``answered``: told when an answer ends, with when its audio plays out (perf_counter; None: it
    had none); ``send`` and ``send_error``: the session's events."""

    def __init__(self, settings: Settings, pipeline: PipelineSpec, engine: AsyncOmni, pool: EnginePool,
                 metrics: ServerMetrics, session_id: str, dialect: str, *, pause: SessionPause,
                 conversation: Conversation, idle: IdleWatch, answered: Callable[[float | None], None], send: Send,
                 send_error: SendError) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.engine = engine
        self.pool = pool
        self.metrics = metrics
        self.session_id = session_id
        self.dialect = dialect
        self.pause = pause
        self.conversation = conversation
        self.idle = idle
        self.answered = answered
        self.send = send
        self.send_error = send_error
        self.task: asyncio.Task[None] | None = None
        self.id: str | None = None
        self.item: ConversationItem | None = None
        self._cancel_reason = "client_cancelled"  # why the running response is being cancelled
        self._speech_end: tuple[float, str] | None = None  # of the turn being started (None: no audio in it)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def holds(self, item: ConversationItem) -> bool:
        """Whether ``item`` is the running response's (its message, or an item it made): not to be changed while it
        runs."""
        return self.running and (item is self.item or (item.response_id is not None and item.response_id == self.id))

    async def create(self, event: ResponseCreate) -> None:
        await self.start(event.response)

    async def start(self, options: ResponseOptions | BetaResponseOptions | None,
                    tentative: AnswerAhead | None = None) -> None:
        """Start answering the pending user items (refused while paused, answering, or with nothing to answer).
        ``tentative``: an answer started ahead for this very turn (``speculative_start.py``; the turn controller
        keeps one only while what it was planned from stands): its plan and stream are the response's, unless it
        failed to start."""
        if self.pause.paused:
            raise EventError("the session is paused; send session.resume first", None, code="session_paused")
        if self.running:
            raise EventError("a response is already in progress; cancel it or wait for response.done", None,
                             code="conversation_already_has_active_response")
        if not self.conversation.has_pending():
            raise EventError("there is nothing to respond to: create a user message item or commit audio first",
                             None, code="no_input")
        adopted = None
        if tentative is not None:
            adopted = await tentative.adopt()
            self.metrics.count_speculative_start("released" if adopted is not None else "dropped")
        # bad options are refused before the turn is taken
        plan, outputs = adopted or (self.plan(options, *self.conversation.peek_turn()), None)
        turn, _ = await self.conversation.take_turn()
        self._speech_end = turn.speech_end if plan.spoken_turn else None
        response_id = tentative.response_id if adopted is not None and tentative is not None \
            else f"resp_{uuid.uuid4().hex[:24]}"
        self.run(response_id, plan, outputs)

    def run(self, response_id: str, plan: AnswerPlan, outputs: AsyncIterator[OmniRequestOutput] | None) -> None:
        """Run a response (``outputs``: its stream, None: started from ``plan``) and send its events; a duplex
        session's one long response is run this way, with no turn of the conversation taken."""
        self.id = response_id
        self.task = asyncio.create_task(self._respond(response_id, plan, outputs),
                                        name=f"omnipipe-realtime-{response_id}")

    def plan(self, options: ResponseOptions | BetaResponseOptions | None, turn: Turn,
             history: list[dict[str, Any]]) -> AnswerPlan:
        """What the engine is asked for a turn: the prompt (the history when the pipeline takes it, the turn's
        words and audio), each stage's sampling, the output modalities and token limit."""
        modalities, limit = self._modalities_and_limit(options)
        sampling = self.sampling(modalities, limit)
        prompt: dict[str, Any] = {"prompt": " ".join(turn.texts)}
        if self.pipeline.takes_history:
            prompt["history"] = history
        if self.settings.tools:
            prompt["tools"] = [dict(tool) for tool in self.settings.tools]
        media: dict[str, Any] = {}
        if turn.audio is not None:  # the stream it came in as, already heard by the pipeline; else the clip
            media["audio"] = [{"stream": turn.audio_stream}] if turn.audio_stream else (turn.audio, PCM16_RATE_HZ)
        if turn.images:
            media["image"] = list(turn.images)
        if turn.frames:
            for key, values in frames_media(self.pipeline, self.engine.deploy, turn.frames).items():
                media[key] = media.get(key, []) + values
        if media:
            prompt["multi_modal_data"] = media
        # what a stage finds wrong with the question is in the committed audio when the turn has no typed text
        typed = turn.texts and not turn.heard
        fields = {"prompt.multi_modal_data.audio": "input_audio_buffer",
                  "prompt.multi_modal_data.image": "item.content",
                  "prompt.multi_modal_data.video": "input_video_frame.append",
                  "prompt": "item.content" if typed else "input_audio_buffer",
                  "prompt.tools": "session.tools", "prompt.history": "item"}
        calls = bool(self.settings.tools) and self.settings.tool_choice != "none"
        return AnswerPlan(prompt, modalities, sampling or None, fields, limit, turn.audio is not None or turn.heard,
                          calls)

    def _modalities_and_limit(self, options: ResponseOptions | BetaResponseOptions | None,
                              ) -> tuple[list[str], int | str]:
        """The response's output modalities and token limit: the session's, or those the response asks for."""
        modalities = self.settings.modalities
        limit = self.settings.max_output_tokens
        if options is None:
            return modalities, limit
        asked = options.output_modalities if isinstance(options, ResponseOptions) else options.modalities
        if asked is not None:
            field_name = output_modalities_field(self.dialect)
            modalities = check_modalities(self.pipeline, ["text", "audio"] if "audio" in asked else ["text"],
                                          f"response.{field_name}")
        asked_limit = options.max_output_tokens if isinstance(options, ResponseOptions) \
            else options.max_response_output_tokens
        if asked_limit is not None:
            name = "max_output_tokens" if isinstance(options, ResponseOptions) else "max_response_output_tokens"
            if asked_limit != "inf":
                check_sampling({"max_tokens": asked_limit}, f"response.{name}")
            limit = asked_limit
        return modalities, limit

    def sampling(self, modalities: list[str], limit: int | str) -> dict[str, SamplingParams]:
        """Each stage's sampling for the response: the token limit and temperature, the speed, the voice."""
        pipeline = self.pipeline
        params: dict[str, Any] = {}
        if limit != "inf":
            params["max_tokens"] = limit
        if self.settings.temperature is not None:
            params["temperature"] = self.settings.temperature
        if self.settings.tools:  # the tools go with the prompt; how the model may call them, with the thinker
            choice = self.settings.tool_choice
            params["tool_choice"] = {"name": choice["name"]} if isinstance(choice, dict) else choice
            params["parallel_tool_calls"] = self.settings.parallel_tool_calls
        stage = pipeline.comprehension_stage or pipeline.stages[0].name
        sampling = {stage: SamplingParams.from_dict(params)} if params else {}
        speed_stage = pipeline.serving.speed_stage
        if speed_stage is not None and "audio" in modalities and self.settings.speed != 1.0:
            sampling[speed_stage] = SamplingParams(extra={"speed": self.settings.speed})
        if "audio" in modalities:  # the session's voice, checked when it was set
            voice = self.pool.check_voice(self.settings.voice, pipeline, "session.voice")
            sampling = with_voice(sampling, voice, pipeline, "session.voice")
        return sampling

    async def cancel_by_client(self, event: ResponseCancel) -> None:
        if not self.running:
            raise EventError("there is no response in progress to cancel", None, code="response_cancel_not_active")
        if event.response_id is not None and event.response_id != self.id:
            raise EventError(f"response_id: {event.response_id!r} is not the response in progress", "response_id",
                             code="response_cancel_not_active")
        await self.cancel()

    async def cancel(self, reason: str = "client_cancelled") -> None:
        """Abort the running response (if any) and wait until it has sent its ``response.done`` (status
        ``cancelled`` with ``reason``: ``turn_detected`` for a barge-in, else ``client_cancelled``)."""
        task = self.task
        if task is None or task.done():
            return
        self._cancel_reason = reason
        if self.id is not None:
            await self.engine.abort(self.id)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _respond(self, response_id: str, plan: AnswerPlan,
                       outputs: AsyncIterator[OmniRequestOutput] | None = None) -> None:
        """Run the answer (``outputs``: one started ahead) and send its events, ending with ``response.done``
        (completed, cancelled or failed)."""
        modalities = plan.modalities
        item = ConversationItem(new_item_id(), "assistant", spoken="audio" in modalities, status="in_progress",
                                response_id=response_id)
        self.item = item
        answer = _Answer(response_id, item, speech_end=self._speech_end)
        status = "failed"
        details: dict[str, Any] | None = None

        def response(state: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                     details: dict[str, Any] | None = None) -> dict[str, Any]:
            return response_object(self.dialect, response_id, state, modalities, output, details, usage,
                                   self.settings.voice, plan.max_output_tokens)

        if outputs is None:
            outputs = self.generate(response_id, plan)
        try:
            await self.send(ServerEvent.RESPONSE_CREATED, response=response("in_progress", []))
            if not plan.calls:  # without tools the answer is one message: it opens at once
                await self._open_message(answer)
            await self._stream(outputs, answer)
            status = "completed"
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self._cancel_reason}
        except Exception as exc:  # noqa: BLE001 - reported as an error event and a failed response
            error = from_engine_error(exc, plan.fields)
            details = {"type": "failed", "error": {"type": error.type, "code": error.code, "message": error.message}}
            await self.send_error(error.message, param=error.param, code=error.code, type_=error.type)
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        text = "".join(answer.text_parts)
        item.words = text.strip()  # of a cancelled answer: the words sent before the cancel
        item.audio_ms = answer.audio_samples * 1000 / PCM16_RATE_HZ
        item.status = "completed" if status == "completed" else "incomplete"
        for output in answer.outputs:
            if output.type == "function_call":
                output.status = item.status
            if output in self.conversation.items:  # the answer got as far as adding the item
                await (self._close_item(answer, text) if output is item else self._close_call(answer, output))
        final = answer.final
        if final is not None:
            self.metrics.observe(REALTIME_PATH, final.metrics)
        if answer.audio_samples:
            self.metrics.observe_spoken_answer(answer.playback.underruns)
        metrics = final.metrics if final is not None else None
        out_tokens = metrics.num_output_tokens if metrics is not None else 0
        in_tokens = metrics.num_prompt_tokens if metrics is not None else 0
        cached = metrics.num_cached_tokens if metrics is not None else 0
        usage = {"total_tokens": in_tokens + out_tokens, "input_tokens": in_tokens, "output_tokens": out_tokens,
                 "input_token_details": {"cached_tokens": cached}}
        self.idle.touch()  # the idle count starts when the answer ends
        self.answered(answer.playback.ends_at)  # server VAD's idle_timeout_ms counts from there
        await self.send(ServerEvent.RESPONSE_DONE, response=response(
            status, [output.wire(self.dialect) for output in answer.outputs
                     if output in self.conversation.items], usage, details))

    def generate(self, response_id: str, plan: AnswerPlan) -> AsyncIterator[OmniRequestOutput]:
        """The engine's stream of a planned answer (the request starts when it is first read), in the session's name:
        a stage may keep what it computed of the conversation for the next turn (the thinker's prefix cache)."""
        return self.engine.generate(plan.prompt, request_id=response_id, sampling_params=plan.sampling,
                                    output_modalities=plan.modalities, session_id=self.session_id)

    async def _open_message(self, answer: _Answer) -> None:
        """The answer's message: its output item, conversation item and content part."""
        item = answer.item
        answer.outputs.append(item)
        await self.send(ServerEvent.RESPONSE_OUTPUT_ITEM_ADDED, response_id=answer.response_id,
                        output_index=answer.index(item), item=item.wire(self.dialect))
        await self.conversation.add(item)
        await self.send(ServerEvent.RESPONSE_CONTENT_PART_ADDED, **answer.base, part=answer.part(""))

    async def _text(self, answer: _Answer, delta: str) -> None:
        """A piece of the answer's words (blank ones before the message opens wait: a call may follow them)."""
        if not answer.message_open:
            if not delta.strip():
                answer.held.append(delta)
                return
            await self._open_message(answer)
            delta, answer.held = "".join(answer.held) + delta, []
        answer.text_parts.append(delta)
        kind = ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA if answer.item.spoken \
            else ServerEvent.RESPONSE_OUTPUT_TEXT_DELTA
        await self.send(kind, delta=delta, **answer.base)

    async def _call_pieces(self, answer: _Answer, pieces: list[dict[str, Any]]) -> None:
        """The model's calls as they come: a ``function_call`` item when a function is named, then its
        arguments' deltas."""
        for piece in answer.calls.add(pieces):
            index = piece["index"]
            if "name" in piece:
                call = ConversationItem(new_item_id(), "assistant", type="function_call", call_id=piece["id"],
                                        name=piece["name"], status="in_progress", response_id=answer.response_id)
                answer.call_items[index] = call
                answer.outputs.append(call)
                await self.send(ServerEvent.RESPONSE_OUTPUT_ITEM_ADDED, response_id=answer.response_id,
                                output_index=answer.index(call), item=call.wire(self.dialect))
                await self.conversation.add(call)
            if "arguments" in piece:
                call = answer.call_items[index]
                call.arguments += piece["arguments"]
                await self.send(ServerEvent.RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA, response_id=answer.response_id,
                                item_id=call.id, output_index=answer.index(call), call_id=call.call_id,
                                delta=piece["arguments"])

    async def _stream(self, outputs: AsyncIterator[OmniRequestOutput], answer: _Answer) -> None:
        """Send the engine's outputs as deltas (the transcript or text, the audio as pcm16 at 24 kHz, the calls'
        arguments)."""
        spoken = answer.item.spoken
        async for out in outputs:
            if out.modality == "text" and (out.text_delta or out.details):
                pieces = (out.details or {}).get("tool_calls")
                if pieces:
                    await self._call_pieces(answer, pieces)
                if out.text_delta:
                    await self._text(answer, out.text_delta)
            elif out.modality == "audio" and spoken and out.audio is not None and out.sample_rate_hz:
                if not answer.message_open:
                    if answer.call_items:
                        continue  # a call is never spoken
                    await self._open_message(answer)
                answer.pcm = answer.pcm or Pcm16Stream(out.sample_rate_hz)
                data = answer.pcm.feed(out.audio)
                if data:
                    await self._audio_delta(answer, data)
            elif out.finished:
                answer.final = out
        if answer.final is not None and answer.final.finish_reason == "abort":  # cancel's abort got here first
            raise asyncio.CancelledError
        if answer.pcm is not None:
            tail = answer.pcm.flush()
            if tail:
                await self._audio_delta(answer, tail)

    async def _audio_delta(self, answer: _Answer, data: bytes) -> None:
        first = answer.audio_samples == 0
        answer.audio_samples += len(data) // 2
        answer.playback.feed(time.perf_counter(), len(data) / 2 / PCM16_RATE_HZ)
        await self.send(ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA, delta=base64.b64encode(data).decode(), **answer.base)
        if first and answer.speech_end is not None:
            ended_at, turn_end = answer.speech_end
            self.metrics.observe_speech_end_to_first_audio(time.perf_counter() - ended_at, turn_end)

    async def _close_item(self, answer: _Answer, text: str) -> None:
        """The ``.done`` events of the answer's deltas, content part and item (sent also for a cancelled answer)."""
        item, base = answer.item, answer.base
        if item.spoken:
            await self.send(ServerEvent.RESPONSE_OUTPUT_AUDIO_DONE, **base)
            await self.send(ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DONE, transcript=text, **base)
        else:
            await self.send(ServerEvent.RESPONSE_OUTPUT_TEXT_DONE, text=text, **base)
        await self.send(ServerEvent.RESPONSE_CONTENT_PART_DONE, **base, part=answer.part(text))
        await self._item_done(answer, item)

    async def _close_call(self, answer: _Answer, call: ConversationItem) -> None:
        """A function call's ``.done`` events (its arguments only when it completed)."""
        if call.status == "completed":
            await self.send(ServerEvent.RESPONSE_FUNCTION_CALL_ARGUMENTS_DONE, response_id=answer.response_id,
                            item_id=call.id, output_index=answer.index(call), call_id=call.call_id, name=call.name,
                            arguments=call.arguments)
        await self._item_done(answer, call)

    async def _item_done(self, answer: _Answer, item: ConversationItem) -> None:
        await self.send(ServerEvent.RESPONSE_OUTPUT_ITEM_DONE, response_id=answer.response_id,
                        output_index=answer.index(item), item=item.wire(self.dialect))
        items = self.conversation.items
        index = items.index(item)
        previous = items[index - 1].id if index else None
        await self.send(ServerEvent.CONVERSATION_ITEM_DONE, previous_item_id=previous, item=item.wire(self.dialect))

