"""Stage handoff for the toy family: whole-output input processors and async-chunk processors."""

from __future__ import annotations

from typing import Any

from omnipipe.chunk.context import ChunkContext
from omnipipe.config.pipeline_spec import EntryInput


def text_prompt(prompt: dict[str, Any]) -> EntryInput:
    return EntryInput("thinker", {"text": prompt["prompt"]})


def tts_prompt(prompt: dict[str, Any]) -> EntryInput:
    return EntryInput("talker", {"text": prompt["prompt"]})


def thinker2talker(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"text": "".join(o.get("text", "") for o in outputs)}]


def thinker2talker_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                               ctx: ChunkContext) -> list[dict[str, Any]]:
    """Ship text word by word: a chunk at every space, the rest at the end."""
    state["buffer"] = state.get("buffer", "") + output.get("text", "")
    buffer: str = state["buffer"]
    cut = len(buffer) if is_last else buffer.rfind(" ") + 1
    if cut <= 0:
        return []
    state["buffer"] = buffer[cut:]
    return [{"text": buffer[:cut]}]
