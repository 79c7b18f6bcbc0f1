"""Property-based fuzzing of every client event of ``WS /v1/realtime`` against a real server.

Events are generated from the schema the server validates with (``omnipipe.protocol.realtime``: each event type's
pydantic model, its fields' types, bounds and examples, found by introspection), mostly well formed, with hostile
values mixed in (huge, tiny, negative, NaN and infinite numbers, integers past 64 bits, wrong types, null), plus
junk frames: not JSON, JSON that is not an object, a nesting deeper than any parser's recursion, unknown or missing
types, binary frames.

After every frame a probe (an event of an unknown type with its own ``event_id``) marks the end of the server's
answer to it. The session must stay open throughout (never a close, never 1011), no event may report a server
error (``server_error`` in an ``error`` or a failed response), a frame the schema refuses must get an ``error``
naming the field (and echoing the client's ``event_id``), and afterwards the same session still completes a text
turn; once the socket closes, every stage is idle.
"""

from __future__ import annotations

import base64
import json
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from omnipipe.protocol.realtime import CLIENT_EVENT, CLIENT_EVENT_MODELS, ClientEvent
from tests.server.conftest import ServerProcess, engines_idle

EXAMPLES_PER_TYPE = 30  # a probe round trip takes a few ms; a started toy response a few tens
JUNK_EXAMPLES = 40
RECV_TIMEOUT_S = 60
HOSTILE: list[Any] = [1e308, -1e308, 1e25, 5e-324, float("nan"), float("inf"), float("-inf"), 2**70, -2**70, 2**64,
                      -5, -1, 0, 1, 0.5, True, False, None, "", "x", "\u0000", "1e308", [], [None], {}, {"a": [1]}]
PROBE = "omnipipe.fuzz.probe"


def hostile() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(HOSTILE), st.integers(), st.floats(), st.text(max_size=10),
                     st.lists(st.integers() | st.text(max_size=3), max_size=3),
                     st.dictionaries(st.text(max_size=5), st.integers() | st.none(), max_size=2))


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], one_in: int = 5) -> st.SearchStrategy[Any]:
    # the odd draw is a middle value: Hypothesis draws the bounds of a range far more often
    return st.integers(0, one_in - 1).flatmap(lambda i: odd if i == one_in // 2 else usual)


def bounds(metadata: list[Any]) -> tuple[float | None, float | None]:
    """A field's lower and upper bound (``Field(ge=..., le=...)`` and the like), where it has them."""
    low = high = None
    for item in metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt):
            low = item.ge if isinstance(item, annotated_types.Ge) else item.gt
        elif isinstance(item, annotated_types.Le | annotated_types.Lt):
            high = item.le if isinstance(item, annotated_types.Le) else item.lt
    return low, high


def of_annotation(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Values of a field's type, around its bounds where it has any."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        extra = [m for info in args[1:] if isinstance(info, FieldInfo) for m in info.metadata]
        return of_annotation(args[0], [*metadata, *extra])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return objects(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        low, high = bounds(metadata)
        near = [v for edge in (low, high) if edge is not None for v in (edge - 1, edge, edge + 1)]
        if annotation is int:
            inside = st.integers(int(low or 0), int(high if high is not None else (low or 0) + 64))
            return st.one_of(inside, st.sampled_from([int(v) for v in near] or [0]), st.integers())
        inside = st.floats(float(low or 0), float(high if high is not None else (low or 0) + 2))
        return st.one_of(inside, st.sampled_from([float(v) for v in near] or [0.0]))
    if annotation is str:
        return st.text(max_size=12)
    if origin is list:
        return mostly(st.lists(of_annotation(args[0], []), min_size=1, max_size=3), st.just([]))
    if args:  # a union
        return st.one_of(*(st.none() if a is type(None) else of_annotation(a, []) for a in args))
    return hostile()


def field_values(info: FieldInfo) -> st.SearchStrategy[Any]:
    """Mostly the field's examples where the schema gives some, else values of its type; hostile now and then."""
    usual = of_annotation(info.annotation, list(info.metadata))
    if info.examples:
        usual = mostly(st.sampled_from(info.examples), usual, 3)
    return mostly(usual, hostile(), 6)


def objects(model: type[BaseModel], but: str | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """Objects of ``model``'s fields (all ``but`` one): the required ones nearly always there, the others now and
    then."""
    fields = {name: info for name, info in model.model_fields.items() if name != but}
    required = {n: field_values(i) for n, i in fields.items() if i.is_required()}
    optional = {n: field_values(i) for n, i in fields.items() if not i.is_required()}
    complete = st.fixed_dictionaries(required, optional=optional)
    partial = st.fixed_dictionaries({}, optional={**required, **optional})
    return mostly(complete, partial, 8)


def events_of(type_: str) -> st.SearchStrategy[dict[str, Any]]:
    """Events of one type, from its model (``event_id`` included, a type gone wrong now and then)."""
    model = CLIENT_EVENT_MODELS[type_]
    return st.builds(lambda fields, kind: {"type": kind, **fields}, objects(model, but="type"),
                     mostly(st.just(type_), hostile(), 15))


def frames_of(events: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[str]:
    return events.map(lambda event: json.dumps(event, allow_nan=True))


JUNK = st.one_of(
    st.sampled_from(["not json", "", "{", "[]", "null", "1e999999", '"session.update"', "[" * 100_000 + "]" * 100_000,
                     '{"type": ' + "[" * 50_000 + "]" * 50_000 + "}", '{"type": 5}', '{"no": "type"}',
                     json.dumps({"type": "x" * 100_000}), '{"type": "session.update", "session": NaN}']),
    st.text(max_size=40),
    st.binary(max_size=64),  # sent as a binary frame
    frames_of(st.fixed_dictionaries({"type": st.text(max_size=30)}, optional={"event_id": hostile()})),
)


# ---------------------------------------------------------------------------------------------- the session
def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


class Fuzzer:
    """One realtime session: sends frames, reads every event, and checks the invariants."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.probes = 0
        self.frames = 0
        self.seen: list[dict[str, Any]] = []

    def recv(self) -> dict[str, Any]:
        try:
            event = json.loads(self.ws.recv(timeout=RECV_TIMEOUT_S))
        except ConnectionClosed as exc:
            raise AssertionError(f"the server closed the session: {exc!r} after {self.frames} frames") from exc
        assert isinstance(event, dict) and isinstance(event.get("type"), str), event
        error = event.get("error") if event["type"] == "error" else None
        assert error is None or error.get("type") != "server_error", event
        if event["type"] == "response.done":
            details = event["response"]["status_details"] or {}
            assert (details.get("error") or {}).get("type") != "server_error", event
        self.seen.append(event)
        return event

    def exchange(self, frame: str | bytes) -> list[dict[str, Any]]:
        """Send ``frame``, then a probe; the events before the probe's own error (its answer, and whatever a
        running response sent meanwhile)."""
        self.frames += 1
        self.ws.send(frame)
        self.probes += 1
        probe_id = f"probe-{self.probes}"
        self.ws.send(json.dumps({"type": PROBE, "event_id": probe_id}))
        answer = []
        while True:
            event = self.recv()
            if event["type"] == "error" and event["error"].get("event_id") == probe_id:
                assert event["error"]["code"] == "invalid_event_type", event
                return answer
            answer.append(event)

    def check_refusal(self, frame: str | bytes, answer: list[dict[str, Any]]) -> None:
        """A frame the schema refuses gets an ``error`` naming the problem."""
        if isinstance(frame, bytes):
            assert any(e["type"] == "error" for e in answer), (frame, answer)
            return
        try:
            raw = json.loads(frame)
        except (ValueError, RecursionError):
            assert any(e["type"] == "error" and e["error"]["code"] == "invalid_json" for e in answer), (frame[:200],
                                                                                                      answer)
            return
        try:
            CLIENT_EVENT.validate_python(raw)
        except ValidationError:
            pass
        else:
            return  # valid for the schema: what follows depends on the session
        errors = [e["error"] for e in answer if e["type"] == "error"]
        assert errors, (frame[:500], answer)
        error = errors[0]
        assert error["type"] == "invalid_request_error" and error["message"], (frame[:500], error)
        if isinstance(raw, dict):
            assert error["param"], (frame[:500], error)  # the field (or "type") it refuses
            model = CLIENT_EVENT_MODELS.get(raw["type"]) if isinstance(raw.get("type"), str) else None
            fields = {"type", *(model.model_fields if model is not None else ())}
            assert error["param"].split(".")[0].split("[")[0] in fields, (frame[:500], error)
            if isinstance(raw.get("event_id"), str):
                assert error["event_id"] == raw["event_id"], (frame[:500], error)

    def send_and_check(self, frame: str | bytes) -> None:
        self.check_refusal(frame, self.exchange(frame))

    def wait_for(self, *types: str) -> dict[str, Any]:
        while True:
            event = self.recv()
            if event["type"] in types:
                return event

    def completes_a_text_turn(self) -> None:
        """After whatever the fuzzing left (paused, a response running, audio in the buffer, VAD on)."""
        for type_ in (ClientEvent.SESSION_RESUME, ClientEvent.INPUT_AUDIO_BUFFER_CLEAR):
            self.exchange(json.dumps({"type": type_}))
        self.exchange(json.dumps({"type": ClientEvent.RESPONSE_CANCEL}))  # a response may still be running
        update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, "output_modalities": ["audio"],
                  "max_output_tokens": "inf"}
        answer = self.exchange(json.dumps({"type": ClientEvent.SESSION_UPDATE, "session": update}))
        assert any(e["type"] == "session.updated" for e in answer), answer
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "after fuzzing"}]}
        answer = self.exchange(json.dumps({"type": ClientEvent.CONVERSATION_ITEM_CREATE, "item": item}))
        assert any(e["type"] == "conversation.item.added" for e in answer), answer
        self.ws.send(json.dumps({"type": ClientEvent.RESPONSE_CREATE, "event_id": "final"}))
        while True:
            event = self.wait_for("response.created", "error")
            if event["type"] == "response.created":
                break
            assert event["error"]["event_id"] != "final", event  # refused: something the fuzzing left
        response_id = event["response"]["id"]
        done = self.wait_for("response.done")
        while done["response"]["id"] != response_id:
            done = self.wait_for("response.done")
        assert done["response"]["status"] == "completed", done
        transcript = [e["delta"] for e in self.seen if e["type"] == "response.output_audio_transcript.delta"
                      and e.get("response_id") == response_id]
        # the turn also answers the text items the fuzzing created since its last response
        assert "".join(transcript).endswith("AFTER FUZZING"), transcript


@contextmanager
def fuzzing(server: ServerProcess) -> Iterator[Fuzzer]:
    with connect(ws_url(server), additional_headers=server.headers, max_size=None, open_timeout=60) as ws:
        fuzzer = Fuzzer(ws)
        assert fuzzer.recv()["type"] == "session.created"
        yield fuzzer
        fuzzer.completes_a_text_turn()
    state = server.wait_idle(timeout_s=30)
    assert engines_idle(state), state
    assert server.process.poll() is None


def run(fuzzer: Fuzzer, strategy: st.SearchStrategy[Any], examples: int) -> None:
    @given(frame=strategy)
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(frame: str | bytes) -> None:
        fuzzer.send_and_check(frame)

    check()


# ---------------------------------------------------------------------------------------------- tests
def test_the_schema_has_a_model_for_every_client_event() -> None:
    names = {value for key, value in vars(ClientEvent).items() if not key.startswith("_")}
    assert set(CLIENT_EVENT_MODELS) == names
    assert PROBE not in names


@pytest.mark.parametrize("type_", sorted(CLIENT_EVENT_MODELS))
def test_every_client_event_keeps_the_session_working(toy_server: ServerProcess, type_: str) -> None:
    with fuzzing(toy_server) as fuzzer:
        run(fuzzer, frames_of(events_of(type_)), EXAMPLES_PER_TYPE)


def test_junk_frames_get_errors_and_keep_the_session_working(toy_server: ServerProcess) -> None:
    with fuzzing(toy_server) as fuzzer:
        run(fuzzer, JUNK, JUNK_EXAMPLES)


def test_a_mix_of_all_events_keeps_the_session_working(toy_server: ServerProcess) -> None:
    """Events of every type in one session, so one leaves the state the next is checked in (paused, VAD on,
    audio buffered, a response running)."""
    every = st.one_of(*(events_of(t) for t in sorted(CLIENT_EVENT_MODELS)))
    with fuzzing(toy_server) as fuzzer:
        run(fuzzer, frames_of(every) | JUNK, 4 * EXAMPLES_PER_TYPE)


def test_large_audio_appends_fill_the_buffer_to_its_limit(toy_server: ServerProcess) -> None:
    chunk = base64.b64encode(bytes(600_000)).decode()  # 12.5 s of silence per append; the buffer takes 2 MB
    with fuzzing(toy_server) as fuzzer:
        codes = []
        for _ in range(5):
            answer = fuzzer.exchange(json.dumps({"type": ClientEvent.INPUT_AUDIO_BUFFER_APPEND, "audio": chunk}))
            codes += [e["error"]["code"] for e in answer if e["type"] == "error"]
        assert codes and set(codes) == {"buffer_too_large"}, codes
