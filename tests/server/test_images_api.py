"""``/v1/images/generations`` as OpenAI clients use it, against a real server with the image pipeline (the trained
digits model), and a think-and-draw chat: the image drawn is the one asked for (checked by a classifier), streams
bring partial images, what is not built is refused by name."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from omnipipe.models.image.judge import recognise
from tests.server.conftest import API_KEY, AUTH, ServerProcess, running_server

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("image", None, tmp_path_factory.mktemp("image-server"), 600) as server:
        yield server


@pytest.fixture(scope="module")
def client(image_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{image_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def decode(b64: str) -> tuple[np.ndarray, str]:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    return np.asarray(image.convert("L")), image.format or ""


def test_images_generate_draws_the_digit_asked_for(client: openai.OpenAI) -> None:
    result = client.images.generate(model="image", prompt="draw a seven", n=4, size="256x256",
                                    extra_body={"seed": 11})
    assert result.data is not None and len(result.data) == 4
    assert result.size == "256x256" and result.output_format == "png"
    images = [decode(d.b64_json or "") for d in result.data]
    assert all(fmt == "PNG" and array.shape == (256, 256) for array, fmt in images)
    small = np.stack([array[::32, ::32] for array, _ in images])  # the crisp 32x32 blocks back to 8x8
    assert (recognise(small) == 7).sum() >= 3
    again = client.images.generate(model="image", prompt="draw a seven", n=1, extra_body={"seed": 11})
    array, _ = decode(again.data[0].b64_json or "")
    assert array.shape == (8, 8)  # size auto: the model's own
    np.testing.assert_array_equal(array, images[0][0][::32, ::32])  # the same seed draws the same digit


def test_a_stream_brings_partial_images_then_the_completed_one(client: openai.OpenAI) -> None:
    events = list(client.images.generate(model="image", prompt="a four", stream=True, partial_images=2,
                                         output_format="webp", extra_body={"seed": 5, "num_inference_steps": 30}))
    kinds = [e.type for e in events]
    assert kinds == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    array, fmt = decode(events[-1].b64_json)
    assert fmt == "WEBP" and array.shape == (8, 8)


@pytest.mark.parametrize("body, param", [
    ({"response_format": "url"}, "response_format"),
    ({"output_format": "gif"}, "output_format"),
    ({"quality": "hd"}, "quality"),
    ({"background": "transparent"}, "background"),
    ({"style": "vivid"}, "style"),
    ({"size": "large"}, "size"),
    ({"size": "100x100"}, "size"),
    ({"n": 2, "stream": True}, "n"),
    ({"partial_images": 2}, "partial_images"),
    ({"output_compression": 50}, "output_compression"),
    ({"num_inference_steps": 0}, "num_inference_steps"),
    ({"prompt": "draw a cat"}, "prompt"),
    ({"steps": 10}, "steps"),
])
def test_what_is_not_built_or_not_valid_is_refused_by_name(image_server: ServerProcess, body: dict,
                                                            param: str) -> None:
    payload = {"model": "image", "prompt": "draw a one", **body}
    with httpx.Client(timeout=60) as http:
        response = http.post(f"{image_server.url}/v1/images/generations", json=payload, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}:") or param in error["message"], error


def test_chat_is_not_served_by_a_pipeline_that_only_draws(image_server: ServerProcess) -> None:
    with httpx.Client(timeout=60) as http:
        response = http.post(f"{image_server.url}/v1/chat/completions", headers=AUTH,
                             json={"model": "image", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 404 and "chat" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def think_and_draw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("think-and-draw", None, tmp_path_factory.mktemp("tad-server"), 600) as server:
        yield server


def test_think_and_draw_answers_in_words_then_draws_the_answer(think_and_draw: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{think_and_draw.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    answer = client.chat.completions.create(
        model="think-and-draw", modalities=["text", "image"], seed=0,  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Draw the number of days in a week."}])
    message = answer.choices[0].message
    assert "seven" in (message.content or "").lower() or "7" in (message.content or "")
    images = (message.model_extra or {})["images"]
    assert len(images) == 1 and images[0]["image_url"]["url"].startswith("data:image/png;base64,")
    array, _ = decode(images[0]["image_url"]["url"].split(",", 1)[1])
    assert array.shape == (8, 8) and recognise(array[None])[0] == 7
    with httpx.Client(timeout=300) as http:  # streamed, with previews
        body = {"model": "think-and-draw", "modalities": ["text", "image"], "stream": True, "seed": 0,
                "messages": [{"role": "user", "content": "Draw the number of days in a week."}],
                "omnipipe": {"sampling_params": {"diffusion": {"extra": {"preview_every": 5}}}}}
        with http.stream("POST", f"{think_and_draw.url}/v1/chat/completions", json=body, headers=AUTH) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines if json.loads(line[6:])["choices"]]
    streamed = [image for d in deltas for image in d.get("images") or []]
    previews = [i for i in streamed if i.get("step") is not None]
    assert len(previews) >= 3 and len(streamed) == len(previews) + 1
    first_image = next(i for i, d in enumerate(deltas) if d.get("images"))
    assert any(d.get("content") for d in deltas[:first_image]), "the words come before the image"
