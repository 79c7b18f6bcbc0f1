"""Named presets the pages offer: a system prompt, a voice and the answer's modalities, chosen in one click.

They come from the gateway's config (``omnipipe gateway --presets FILE``, a YAML or JSON file; see
docs/gateway.md) and are served to the pages by ``GET /api/presets``. A file looks like::

    presets:
      - name: Patient tutor
        instructions: Explain step by step, in short sentences.
        voice: default
        output_modalities: [text, audio]

Every field is checked here; a bad one is a ``FieldError`` naming it (``presets[1].voice``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from omnipipe.util.field_error import FieldError

OUTPUT_MODALITIES = (("text",), ("text", "audio"))
"""What a preset may answer with: text alone, or text and speech."""

MAX_NAME_CHARS = 64
MAX_INSTRUCTIONS_CHARS = 20_000
VOICE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_FIELDS = ("name", "instructions", "voice", "output_modalities")


@dataclass(frozen=True)
class Preset:
    """``voice`` ``None`` leaves the page's own voice; ``output_modalities`` is one of ``OUTPUT_MODALITIES``."""

    name: str
    instructions: str = ""
    voice: str | None = None
    output_modalities: tuple[str, ...] = ("text", "audio")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise FieldError("name", "give a non-empty name")
        if len(self.name) > MAX_NAME_CHARS:
            raise FieldError("name", f"at most {MAX_NAME_CHARS} characters, got {len(self.name)}")
        if not isinstance(self.instructions, str):
            raise FieldError("instructions", f"expected a string, got {type(self.instructions).__name__}")
        if len(self.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise FieldError("instructions", f"at most {MAX_INSTRUCTIONS_CHARS} characters, "
                             f"got {len(self.instructions)}")
        if self.voice is not None and (not isinstance(self.voice, str) or not VOICE_PATTERN.fullmatch(self.voice)):
            raise FieldError("voice", f"a voice name (1-64 letters, digits, '_', '.' or '-'), got {self.voice!r}")
        modalities = self.output_modalities
        if not isinstance(modalities, (list, tuple)) or tuple(sorted(modalities, key=_modality_order)) \
                not in OUTPUT_MODALITIES:
            raise FieldError("output_modalities", f"expected [text] or [text, audio], got {modalities!r}")
        object.__setattr__(self, "output_modalities", tuple(sorted(modalities, key=_modality_order)))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "instructions": self.instructions, "voice": self.voice,
                "output_modalities": list(self.output_modalities)}


def _modality_order(modality: Any) -> int:
    return ("text", "audio").index(modality) if modality in ("text", "audio") else 2


def presets_from_data(data: Any, field: str = "presets") -> list[Preset]:
    """Presets from parsed YAML/JSON (or ``Preset`` objects): a list, names unique; errors name
    ``presets[i].field``."""
    if not isinstance(data, list):
        raise FieldError(field, f"expected a list of presets, got {type(data).__name__}")
    presets: list[Preset] = []
    for index, entry in enumerate(data):
        where = f"{field}[{index}]"
        if isinstance(entry, Preset):
            entry = entry.to_json()
        if not isinstance(entry, dict):
            raise FieldError(where, f"expected an object with {', '.join(_FIELDS)}, got {type(entry).__name__}")
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise FieldError(f"{where}.{unknown[0]}", f"unknown field (fields: {', '.join(_FIELDS)})")
        if "name" not in entry:
            raise FieldError(f"{where}.name", "missing; every preset needs a name")
        try:
            preset = Preset(**entry)
        except FieldError as exc:
            raise exc.renamed(f"{where}.{exc.field}") from None
        if any(p.name == preset.name for p in presets):
            raise FieldError(f"{where}.name", f"{preset.name!r} is already the name of another preset")
        presets.append(preset)
    return presets


def load_presets(path: Path) -> list[Preset]:
    """The presets in the YAML or JSON file ``path``: ``{"presets": [...]}`` (or the list itself)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FieldError("presets", f"cannot read {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise FieldError("presets", f"{path} is not valid YAML or JSON: {exc}") from None
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"presets"})
        if unknown:
            raise FieldError(unknown[0], f"unknown key in {path} (expected: presets)")
        data = data.get("presets", [])
    return presets_from_data(data)
