"""util/data_url.py: the one reader of inline ``data:<type>;base64,<data>`` URLs, its form, kinds, limit and
messages."""

from __future__ import annotations

import base64

import pytest

from omnipipe.util.data_url import DataUrlError, parse_data_url, size_text
from omnipipe.util.field_error import FieldError


def url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_gives_the_media_type_and_the_bytes() -> None:
    assert parse_data_url(url("image/png", b"\x89PNG"), field="f") == ("image/png", b"\x89PNG")
    assert parse_data_url(url("audio/wav", b"RIFF"), field="f", kind="audio") == ("audio/wav", b"RIFF")


def test_parameters_before_base64_are_not_part_of_the_type() -> None:
    assert parse_data_url("data:text/plain;charset=utf-8;base64,aGk=", field="f") == ("text/plain", b"hi")


def test_any_type_when_no_kind_is_asked_for() -> None:
    assert parse_data_url(url("application/octet-stream", b"x"), field="f") == ("application/octet-stream", b"x")
    assert parse_data_url("data:;base64,eA==", field="f") == ("", b"x")


def test_empty_data_is_the_callers_rule() -> None:
    assert parse_data_url("data:video/mp4;base64,", field="f", kind="video") == ("video/mp4", b"")


@pytest.mark.parametrize("value, kind, words", [
    ("data:image/png,rawbytes", "image", "a data URL must be data:image/<type>;base64,<data>"),
    ("data:image/png;base64", "image", "a data URL must be data:image/<type>;base64,<data>"),
    ("data:audio/wav;base64,AAAA", "image", "a data URL must be data:image/<type>;base64,<data>"),
    ("DATA:image/png;base64,AAAA", "image", "a data URL must be data:image/<type>;base64,<data>"),
    ("https://example.com/a.png", None, "a data URL must be data:<media type>;base64,<data>"),
    ("data:text/plain,hello", None, "a data URL must be data:<media type>;base64,<data>"),
])
def test_a_malformed_url_or_another_kind_is_refused(value: str, kind: str | None, words: str) -> None:
    with pytest.raises(DataUrlError) as info:
        parse_data_url(value, field="messages[0].url", kind=kind)
    assert info.value.problem == "form" and info.value.field == "messages[0].url"
    assert str(info.value) == f"messages[0].url: {words}"


@pytest.mark.parametrize("body", ["%%%", "AAA", "AA AA", "ÀÀÀÀ"])
def test_bad_base64_is_refused(body: str) -> None:
    with pytest.raises(DataUrlError) as info:
        parse_data_url(f"data:image/png;base64,{body}", field="image", kind="image")
    assert info.value.problem == "base64"
    assert str(info.value) == "image: the data URL's data is not valid base64"


def test_the_error_is_a_field_error() -> None:
    with pytest.raises(FieldError) as info:
        parse_data_url("data:image/png;base64,@@", field="prompt.image")
    assert info.value.field == "prompt.image" and "not valid base64" in info.value.rule


def test_the_size_limit_is_exact_and_checked_before_decoding() -> None:
    limit = 1024 * 1024
    assert parse_data_url(url("image/png", bytes(limit)), field="f", max_bytes=limit)[1] == bytes(limit)
    for size in (limit + 1, limit + 3):
        with pytest.raises(DataUrlError) as info:
            parse_data_url(url("image/png", bytes(size)), field="f", max_bytes=limit)
        assert info.value.problem == "size" and str(info.value) == "f: is larger than 1 MiB"
    # far over the limit: refused on the text's length, even when the text is not base64 at all
    with pytest.raises(DataUrlError) as info:
        parse_data_url("data:image/png;base64," + "@" * (2 * limit), field="f", max_bytes=limit)
    assert info.value.problem == "size"


def test_size_text() -> None:
    assert size_text(256 * 1024 * 1024) == "256 MiB"
    assert size_text(1000) == "1,000 bytes"
