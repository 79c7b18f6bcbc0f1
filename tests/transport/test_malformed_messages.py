"""Garbage on any socket is dropped by its receiver; the engine keeps serving."""

from __future__ import annotations

import msgspec
import pytest
import zmq

from omnipipe.transport import control_plane
from omnipipe.transport.messages import ChunkReady, StageOutput, Submit
from tests.conftest import collect, wait_until_idle

GARBAGE = [
    b"",
    b"\x00\xff\x13garbage",
    msgspec.msgpack.encode({"type": "submit"}),  # missing fields
    msgspec.msgpack.encode({"type": "nope", "x": 1}),  # unknown tag
    msgspec.msgpack.encode([1, 2, 3]),
    msgspec.msgpack.encode({"type": "output", "request_id": 5, "stage": "x", "seq": "a", "finished": "yes"}),
    msgspec.msgpack.encode({"type": "chunk", "key": "k", "request_id": "r", "from_stage": "a", "to_stage": "b",
                            "chunk_id": 0, "is_last": True, "sent_at_s": 0.0,
                            "payload": {"skeleton": b"\xc1", "tensors": [], "nbytes": 0, "backend": "inline",
                                        "data": b""}}),
    msgspec.msgpack.encode({"type": "chunk", "key": "k", "request_id": "r", "from_stage": "a", "to_stage": "b",
                            "chunk_id": 0, "is_last": True, "sent_at_s": 0.0,
                            "payload": {"skeleton": b"\x80", "tensors": [], "nbytes": 64, "backend": "shm",
                                        "relay": {"segment": "omnipipe-none", "slot": 0}}}),
]


@pytest.mark.parametrize("decoder", [control_plane.TO_STAGE, control_plane.FROM_STAGE, control_plane.CHUNK,
                                     control_plane.BROADCAST])
@pytest.mark.parametrize("frame", GARBAGE)
def test_decoders_reject_malformed_frames(decoder, frame) -> None:
    result = control_plane.decode(decoder, frame, "test")
    assert result is None or isinstance(result, (Submit, StageOutput, ChunkReady))


def test_garbage_sent_to_live_sockets_kills_nobody(toy) -> None:
    orchestrator = toy.engine.engine.orchestrator
    targets = [orchestrator.clients["talker"].launch.chunk_listen_address,
               orchestrator.clients["code2wav"].launch.chunk_listen_address,
               orchestrator.clients["thinker"].launch.out_address]
    ctx = zmq.Context()
    try:
        for address in targets:
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(address)
            for frame in GARBAGE:
                sock.send(frame)
            sock.close()
    finally:
        ctx.term()
    before = toy.run(toy.engine.debug_state())
    outputs = toy.run(collect(toy.engine, "still alive"))
    assert outputs[-1].text == "STILL ALIVE"
    after = toy.run(wait_until_idle(toy.engine))
    assert after["pids"] == before["pids"] and not any(after["restarts"].values())
    assert all(s["pending_chunks"] == 0 for s in after["stages"].values())
