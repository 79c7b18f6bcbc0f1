"""Images attached to a written question: the forms a caller may give, the errors naming the field, and the line
the text-only thinker reads for each."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from omnipipe.models.default.attachments import MAX_IMAGES, describe, encoded_image, materialize
from omnipipe.models.default.processors import default_prompt
from omnipipe.util.field_error import FieldError

FIELD = "prompt.multi_modal_data.image"


def _png(colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _prompt(image, text: str = "What is in the picture?", audio=None) -> dict:
    media = {"image": image} if audio is None else {"image": image, "audio": audio}
    return {"prompt": text, "multi_modal_data": media, "history": []}


def test_every_accepted_form_becomes_the_same_decoded_pixels(tmp_path) -> None:
    raw = _png((200, 30, 30))
    path = tmp_path / "red.png"
    path.write_bytes(raw)
    array = np.zeros((48, 64, 3), np.uint8)
    array[:] = (200, 30, 30)
    forms = [raw, str(path), path, f"data:image/png;base64,{base64.b64encode(raw).decode()}", array,
             Image.fromarray(array), np.dstack([array, np.full((48, 64), 255, np.uint8)])]
    for form in forms:
        pixels = materialize({"images": [encoded_image(form, FIELD)]})["images"][0]
        assert pixels.shape == (3, 48, 64) and str(pixels.dtype) == "torch.float32"
        assert np.allclose(pixels[:, 0, 0].numpy() * 255, (200, 30, 30), atol=0.5), type(form)


@pytest.mark.parametrize(("value", "rule"), [
    (b"", "is empty"),
    (b"not an image at all", "is not an image file"),
    ("/no/such/file.png", "file not found"),
    ("data:text/plain;base64,aGVsbG8=", "data:image/<type>;base64"),
    ("data:image/png;base64,@@@", "not valid base64"),
    (np.zeros((4, 4), np.float32), "uint8"),
    (12, "expected a path"),
])
def test_unusable_images_are_refused_naming_the_field(value, rule: str) -> None:
    with pytest.raises(FieldError, match=rule) as info:
        encoded_image(value, FIELD)
    assert info.value.field == FIELD


def test_too_many_pixels_are_refused_before_decoding() -> None:
    buffer = io.BytesIO()
    Image.new("L", (5000, 4000)).save(buffer, format="PNG")  # compresses to a few kB
    with pytest.raises(FieldError, match="5000x4000 pixels"):
        encoded_image(buffer.getvalue(), FIELD)


def test_the_prompt_processor_sends_images_to_the_thinker_with_the_question() -> None:
    entry = default_prompt(_prompt([_png((0, 0, 255)), _png((0, 255, 0))]))
    assert entry.stage == "thinker"
    assert entry.data["text"] == "What is in the picture?" and len(entry.data["images"]) == 2
    with pytest.raises(FieldError, match="needs a written question") as info:
        default_prompt(_prompt(_png((0, 0, 255)), text="  "))
    assert info.value.field == "prompt.prompt"
    with pytest.raises(FieldError, match="spoken question takes no attachment"):
        default_prompt(_prompt(_png((0, 0, 255)), audio=b"RIFF"))
    with pytest.raises(FieldError, match=f"give 1 to {MAX_IMAGES} images") as info:
        default_prompt(_prompt([_png((0, 0, 255))] * (MAX_IMAGES + 1)))
    assert info.value.field == FIELD
    with pytest.raises(FieldError) as info:
        default_prompt(_prompt([_png((0, 0, 255)), b"junk"]))
    assert info.value.field == f"{FIELD}[1]"


def test_each_image_is_read_as_its_size_and_main_colour() -> None:
    images = materialize({"images": [_png((210, 25, 30), (1280, 720)), _png((20, 60, 220)), _png((250, 250, 245))]})
    assert describe(images["images"]).splitlines() == [
        "[Attached image 1: 1280x720 pixels, mostly red.]",
        "[Attached image 2: 64x48 pixels, mostly blue.]",
        "[Attached image 3: 64x48 pixels, mostly white.]",
    ]


def test_the_spoken_question_comes_alone_or_as_a_list_of_one() -> None:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(1600, np.float32), 16_000, format="WAV")
    for audio in (buffer.getvalue(), [buffer.getvalue()]):
        entry = default_prompt({"prompt": "", "multi_modal_data": {"audio": audio}, "history": []})
        assert entry.stage == "encoder" and entry.data["audio"].shape == (1600,)
    with pytest.raises(FieldError, match="takes one spoken question, got 2") as info:
        default_prompt({"prompt": "", "multi_modal_data": {"audio": [buffer.getvalue()] * 2}, "history": []})
    assert info.value.field == "prompt.multi_modal_data.audio"
