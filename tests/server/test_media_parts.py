"""Media content parts of a chat request (``image_url``, ``input_audio``, ``audio_url``, ``video_url``): routed into
``prompt["multi_modal_data"]`` as lists of file bytes for a pipeline that takes them, with the API field of each
for naming what a stage finds wrong; refused with a 400 naming the part by a pipeline that does not (the ``toy``
server, text only, through the official client)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import openai
import pytest

from omnipipe.models.toy.pipeline import PIPELINE as TOY
from omnipipe.protocol.openai import ChatCompletionRequest
from omnipipe.server.errors import APIError, map_field
from omnipipe.server.routes.chat import message_content, plan_chat
from omnipipe.server.spoken_answers import SpokenAnswers
from tests.server.conftest import API_KEY, ServerProcess

OMNI = dataclasses.replace(TOY, name="omni_like", input_modalities=("text", "image", "audio", "video"),
                           takes_history=True)
PNG, WAV, MP4, MP3 = b"\x89PNG fake png", b"RIFF fake wav", b"\x00\x00\x00\x18ftypmp42", b"ID3 fake mp3"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_part(data: bytes = PNG, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}}


def input_audio_part(data: bytes = WAV) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": "wav"}}


def audio_url_part(data: bytes = MP3, mime: str = "audio/mpeg") -> dict[str, Any]:
    return {"type": "audio_url", "audio_url": {"url": f"data:{mime};base64,{b64(data)}"}}


def video_url_part(data: bytes = MP4, url: str | None = None) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url or f"data:video/mp4;base64,{b64(data)}"}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def plan(content: list[dict[str, Any]], history: list[dict[str, Any]] | None = None, pipeline: Any = OMNI) -> Any:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [*(history or []), {"role": "user", "content": content}]})
    return plan_chat(body, None, pipeline, SpokenAnswers())  # type: ignore[arg-type] - text answers need no pool


def refusal(content: list[dict[str, Any]], **kwargs: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        plan(content, **kwargs)
    assert caught.value.status == 400
    return caught.value


# ---------------------------------------------------------------------------------------------- routing
def test_every_media_part_goes_to_multi_modal_data_as_lists_in_order() -> None:
    second_png, second_mp4 = PNG + b"2", MP4 + b"2"
    result = plan([text_part("what happens here?"), image_part(), video_url_part(), input_audio_part(),
                   audio_url_part(), image_part(second_png, "image/jpeg"), video_url_part(second_mp4)])
    assert result.prompt["prompt"] == "what happens here?"
    assert result.prompt["multi_modal_data"] == {"image": [PNG, second_png], "video": [MP4, second_mp4],
                                                 "audio": [WAV, MP3]}
    # each file's field, for what a stage finds wrong with it
    assert map_field("prompt.multi_modal_data.video[1]", result.field_map) == "messages[0].content[6].video_url.url"
    assert map_field("prompt.multi_modal_data.audio[0]", result.field_map) == "messages[0].content[3].input_audio.data"
    assert map_field("prompt.multi_modal_data.audio[1]", result.field_map) == "messages[0].content[4].audio_url.url"
    assert map_field("prompt.multi_modal_data.image", result.field_map) == "messages[0].content"
    assert result.audio_param is None  # two audio files: none is "the" spoken question


def test_one_audio_alone_is_the_spoken_question() -> None:
    result = plan([audio_url_part()])
    assert result.prompt["prompt"] == "" and result.prompt["multi_modal_data"] == {"audio": [MP3]}
    assert result.audio_param == "messages[0].content[0].audio_url.url"
    assert map_field("prompt.multi_modal_data.audio", result.field_map) == result.audio_param
    assert map_field("prompt", result.field_map) == result.audio_param


def test_a_video_alone_is_a_question() -> None:
    assert plan([video_url_part()]).prompt["multi_modal_data"] == {"video": [MP4]}


def test_text_only_gives_no_multi_modal_data() -> None:
    assert "multi_modal_data" not in plan([text_part("hello")]).prompt


@pytest.mark.parametrize("part, param, words", [
    (video_url_part(url="https://example.com/v.mp4"), "messages[0].content[1].video_url.url", "fetches nothing"),
    (audio_url_part(mime="image/png"), "messages[0].content[1].audio_url.url", "data:audio/"),
    (image_part(mime="video/mp4"), "messages[0].content[1].image_url.url", "data:image/"),
    (video_url_part(url="data:video/mp4;base64,@@@"), "messages[0].content[1].video_url.url", "base64"),
    (video_url_part(url="data:video/mp4;base64,"), "messages[0].content[1].video_url.url", "empty"),
])
def test_bad_media_parts_are_refused_naming_the_field(part: dict[str, Any], param: str, words: str) -> None:
    error = refusal([text_part("look"), part])
    assert error.param == param and param in error.message and words in error.message


def test_media_in_an_earlier_message_is_refused() -> None:
    earlier = [{"role": "user", "content": [text_part("before"), video_url_part()]},
               {"role": "assistant", "content": "ok"}]
    error = refusal([text_part("and now?")], history=earlier)
    assert error.param == "messages[0].content[1].video_url"


@pytest.mark.parametrize("modality, part", [("image", image_part()), ("audio", audio_url_part()),
                                            ("audio", input_audio_part()), ("video", video_url_part())])
def test_a_pipeline_without_the_modality_refuses_the_part(modality: str, part: dict[str, Any]) -> None:
    others = tuple(m for m in OMNI.input_modalities if m != modality)
    error = refusal([text_part("x"), part], pipeline=dataclasses.replace(OMNI, input_modalities=others))
    assert error.param == f"messages[0].content[1].{part['type']}"
    assert f"does not take {modality} input" in error.message


def test_message_content_of_a_plain_string() -> None:
    content = message_content("  hi  ", "messages[0].content", OMNI)
    assert content.texts == ["hi"] and content.media == {} and content.params == {}


# ---------------------------------------------------------------------------------------------- toy server
@pytest.fixture(scope="module")
def client(toy_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{toy_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.mark.parametrize("part", [image_part(), input_audio_part(), audio_url_part(), video_url_part()],
                         ids=lambda p: p["type"])
def test_text_only_server_refuses_each_media_part_naming_it(client: openai.OpenAI, part: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="toy", messages=[  # type: ignore[list-item]
            {"role": "user", "content": [text_part("what is"), text_part("this?"), part]}])
    error = caught.value.response.json()["error"]
    assert error["param"] == f"messages[0].content[2].{part['type']}", error
    assert error["code"] == "unsupported_modality" and "does not take" in error["message"]


def test_text_only_server_still_answers_text_parts(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="toy", messages=[
        {"role": "user", "content": [text_part("hello"), text_part("there")]}])
    assert answer.choices[0].message.content
