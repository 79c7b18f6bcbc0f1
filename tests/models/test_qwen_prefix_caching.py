"""Automatic prefix caching in the Qwen-Omni thinkers (tiny random checkpoints, in-process with the stage's own
scheduler and step): a prompt that shares its start with an earlier one (a second conversation with the same
system text; the same image and audio asked about again) prefills only the rest, and gives the same tokens and the
same talker hand-off (the prompt's hidden states, its cached part included) as a stage without the cache, greedy in
float32, within the bound of a different prefill split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.stage.runner import RunnerContext, StageRunner
from omnipipe.stage.runner_driver import Arrival, DriveResult, drive
from omnipipe.util.media import load_audio, load_image
from tests.models import media_files

GREEDY = {"temperature": 0.0, "max_tokens": 8}
# cached against computed, of the values' absmax (at least 1): the same float32 sums split at another place
# (measured: below 1e-6 on the tiny checkpoints)
BOUND = 1e-5
SYSTEM = "You answer questions about the picture and the sound. " * 6


def _media(seed: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    image = np.asarray(load_image(media_files.png(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)), "image"))
    audio = load_audio(media_files.wav((0.2 * np.sin(np.arange(16000) / 40)).astype(np.float32)), "audio", 16000)
    return {"images": [image], "audios": [audio]}


def _qwen3(directory: Path, **options: Any) -> StageRunner:
    from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner

    return Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(directory), **options}))


def _qwen2_5(directory: Path, **options: Any) -> StageRunner:
    from omnipipe.models.qwen2_5_omni.runners.thinker import Qwen25ThinkerRunner

    return Qwen25ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(directory), **options}))


def _qwen3_handoff(result: DriveResult, rid: str) -> dict[str, torch.Tensor]:
    data = next(o.data for o in result.outputs[rid] if o.data)
    return {"tokens": torch.tensor([o.data["token"] for o in result.outputs[rid] if o.data]),
            "embeds": data["prompt"]["embeds"], "mm_hidden": data["prompt"]["mm_hidden"]}


def _qwen2_5_handoff(result: DriveResult, rid: str) -> dict[str, torch.Tensor]:
    part = next(o.data["prompt"] for o in result.outputs[rid] if o.data and "prompt" in o.data)
    tokens = [part["first_token"]] + [o.data["token"] for o in result.outputs[rid]
                                      if o.data and "token" in o.data and "prompt" not in o.data]
    return {"tokens": torch.tensor(tokens), "hidden": part["hidden"], "embeds": part["embeds"]}


FAMILIES = {"qwen3": (_qwen3, _qwen3_handoff), "qwen2_5": (_qwen2_5, _qwen2_5_handoff)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    name = request.param
    if name == "qwen3":
        from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint
    else:
        from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp(name) / "ckpt", seed=0)
    make, handoff = FAMILIES[name]
    cached, computed = make(directory), make(directory, prefix_caching=False)
    cached.load()
    computed.load()
    return cached, computed, handoff


def _run(runner: StageRunner, rid: str, item: dict[str, Any]) -> tuple[DriveResult, int]:
    """One request alone: its outputs, and the prompt tokens it found in the prefix cache."""
    before = runner.kv.prefix_hits
    result = drive(runner, [Arrival(rid, GREEDY, [item])])
    assert not result.errors, result.errors
    return result, runner.kv.prefix_hits - before


def _same(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert torch.equal(want["tokens"], got["tokens"])
    for key in want.keys() - {"tokens"}:
        assert want[key].shape == got[key].shape, key
        if want[key].numel():
            scale = max(1.0, float(want[key].abs().max()))
            assert float((want[key] - got[key]).abs().max()) <= BOUND * scale, key


@pytest.mark.models
def test_a_shared_start_is_not_prefilled_again_and_changes_nothing(family: tuple[Any, ...]) -> None:
    cached, computed, handoff = family
    media = _media()
    cases = [("first", {"text": SYSTEM + "What is this?"}),
             ("second", {"text": SYSTEM + "Is it loud?"}),  # another conversation with the same system text
             ("media", {"text": SYSTEM + "Describe both.", **media}),
             ("media-again", {"text": SYSTEM + "Describe both.", **media}),  # the same image and audio again
             ("media-other", {"text": SYSTEM + "Describe both.", "images": _media(4)["images"],
                              "audios": media["audios"]})]  # another image: shared up to the media only
    hits = {}
    for rid, item in cases:
        got, hits[rid] = _run(cached, rid, item)
        want, none = _run(computed, rid, item)
        assert none == 0
        _same(handoff(want, rid), handoff(got, rid))
    block = cached.kv.block_tokens
    assert hits["first"] < 2 * block  # the chat template's start, at most, from the runner's own warm requests
    assert hits["second"] >= 4 * block  # the system text
    # the user turn opens with its media: new ones share what comes before them (the template's start), the same
    # ones the whole prompt to its last whole block, another image again only what comes before it
    assert hits["media-other"] == hits["media"]
    assert hits["media-again"] >= hits["media"] + 4 * block
