"""Images in realtime sessions: ``input_image`` content parts (OpenAI's GA shape, PNG or JPEG data URLs) in
``conversation.item.create`` go to the pipeline with the turn's words; a bad image, or an image for a pipeline that
takes none, is an ``error`` naming the field and the session goes on."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from omnipipe.server.routes.realtime.checks import MAX_IMAGE_BYTES, MAX_ITEM_IMAGES
from tests.server.conftest import ServerProcess, engines_idle
from tests.server.test_realtime import Conn, of, session


def image_url(colour: tuple[int, int, int], kind: str = "PNG", size: int = 64) -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), colour, np.uint8)).save(buffer, kind)
    media = "jpeg" if kind == "JPEG" else kind.lower()
    return f"data:image/{media};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def ask(conn: Conn, *parts: dict[str, str]) -> dict:
    conn.send("conversation.item.create", item={"type": "message", "role": "user", "content": list(parts)})
    _, answer = conn.until("conversation.item.added", "error")
    return answer


def still_works(conn: Conn) -> None:
    conn.send("conversation.item.retrieve", item_id="none")
    assert conn.until("error")[1]["error"]["param"] == "item_id"


def test_an_image_for_a_pipeline_that_takes_none_is_refused_by_name(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        error = ask(conn, {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": image_url((255, 0, 0))})
        assert error["type"] == "error", error
        assert error["error"]["param"] == "item.content[1].image_url", error
        assert error["error"]["code"] == "unsupported_modality" and "does not take images" in error["error"]["message"]
        still_works(conn)


@pytest.mark.models
def test_bad_images_get_errors_naming_the_field(default_server: ServerProcess) -> None:
    text = {"type": "input_text", "text": "what colour is this?"}
    gif = "data:image/gif;base64," + base64.b64encode(b"GIF89a" + bytes(20)).decode()
    too_big = "data:image/png;base64," + "A" * (MAX_IMAGE_BYTES * 4 // 3 + 8)
    cases = [
        ({"type": "input_image", "image_url": gif}, "invalid_image", "image/gif"),
        ({"type": "input_image", "image_url": "data:text/plain;base64,aGVsbG8="}, "invalid_image", "data URL"),
        ({"type": "input_image", "image_url": "data:image/png;base64,***"}, "invalid_image", None),
        ({"type": "input_image", "image_url": too_big}, "image_too_large", "larger than"),
        ({"type": "input_image"}, "missing_field", "required"),
    ]
    with session(default_server) as conn:
        for part, code, words in cases:
            error = ask(conn, text, part)
            assert error["type"] == "error", (part, error)
            assert error["error"]["param"] == "item.content[1].image_url" and error["error"]["code"] == code, error
            assert words is None or words in error["error"]["message"], error
        many = [{"type": "input_image", "image_url": image_url((0, 0, 255))}] * (MAX_ITEM_IMAGES + 1)
        error = ask(conn, text, *many)
        assert error["type"] == "error" and error["error"]["param"] == f"item.content[{MAX_ITEM_IMAGES + 1}].image_url"
        assert ask(conn, {"type": "input_image", "image_url": image_url((0, 0, 255))})["type"] == "error"  # no words
        still_works(conn)
        conn.send("response.create")
        assert conn.until("error")[1]["error"]["code"] == "no_input"  # nothing refused joined the conversation


@pytest.mark.models
def test_the_answer_sees_the_image_of_the_turn(default_server: ServerProcess) -> None:
    """A red picture, then a blue one in the next turn, JPEG: each answer names the colour of its turn's image,
    and the item shows its image as the client sent it."""
    with session(default_server) as conn:
        conn.no_vad(output_modalities=["text"], max_output_tokens=20)
        for colour, name, kind in (((220, 20, 20), "red", "PNG"), ((20, 40, 220), "blue", "JPEG")):
            url = image_url(colour, kind)
            added = ask(conn, {"type": "input_text", "text": "What colour is the attached image? One word."},
                        {"type": "input_image", "image_url": url, "detail": "low"})
            assert added["type"] == "conversation.item.added", added
            assert added["item"]["content"][1] == {"type": "input_image", "image_url": url}
            conn.send("response.create")
            events, done = conn.until("response.done")
            assert done["response"]["status"] == "completed", (done, of(events, "error"))
            said = "".join(d["delta"] for d in of(events, "response.output_text.delta")).lower()
            assert name in said, said
    assert engines_idle(default_server.wait_idle(timeout_s=60))
