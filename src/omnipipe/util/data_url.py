"""``parse_data_url``: an inline ``data:<type>;base64,<data>`` URL read into its media type and bytes.

Every place that takes media inline (prompt attachments, chat content parts, audio sources, recorded sessions)
reads the URL here, so its form, its size limit and the wording of a refusal are the same everywhere. Only base64
data URLs are taken; refusing a remote URL (nothing is fetched) is the caller's rule, worded for its API.
"""

from __future__ import annotations

import base64
import binascii
from typing import Literal

from omnipipe.util.field_error import FieldError

_MIB = 1024 * 1024

Problem = Literal["form", "base64", "size"]


class DataUrlError(FieldError):
    """A refused data URL. ``problem`` names the rule it broke (``form``: not ``data:<type>;base64,<data>`` or not
    the media kind asked for; ``base64``: its data does not decode; ``size``: over the limit), so an API can pick
    its error code without reading the message."""

    def __init__(self, field: str, rule: str, problem: Problem) -> None:
        super().__init__(field, rule)
        self.problem = problem


def size_text(num_bytes: int) -> str:
    """``num_bytes`` as a limit is written in messages: ``256 MiB``, or ``1,000 bytes`` when not whole MiB."""
    return f"{num_bytes // _MIB} MiB" if num_bytes and num_bytes % _MIB == 0 else f"{num_bytes:,} bytes"


def parse_data_url(url: str, *, field: str, kind: str | None = None,
                   max_bytes: int | None = None) -> tuple[str, bytes]:
    """``(media type, decoded bytes)`` of ``url``, a ``data:<type>;base64,<data>`` URL. ``kind`` (``image``,
    ``audio``, ``video``), when given, is the media type's first part the URL must have; ``max_bytes`` bounds the
    decoded size, checked on the base64 text before anything is decoded. The media type may be empty
    (``data:;base64,...``) when no ``kind`` is asked for. The data may be empty: whether that is taken is the
    caller's rule. Raises ``DataUrlError`` (a ``FieldError`` naming ``field``)."""
    header, comma, body = url.partition(",")
    prefix = f"data:{kind}/" if kind else "data:"
    if not (comma and header.startswith(prefix) and header.endswith(";base64")):
        form = f"data:{kind}/<type>" if kind else "data:<media type>"
        raise DataUrlError(field, f"a data URL must be {form};base64,<data>", "form")
    if max_bytes is not None and len(body) > max_bytes * 4 // 3 + 4:
        raise DataUrlError(field, f"is larger than {size_text(max_bytes)}", "size")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise DataUrlError(field, "the data URL's data is not valid base64", "base64") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise DataUrlError(field, f"is larger than {size_text(max_bytes)}", "size")
    return header[len("data:"):].split(";", 1)[0], data
