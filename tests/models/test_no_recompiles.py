"""With ``torch_compile`` on, a Qwen-Omni thinker or talker compiles every graph serving needs in its warm-up: after
``warmup()`` no graph is compiled again, whatever comes (batches of 1, 4 and 6 rows joining at different steps,
prompts of other lengths, answers that cross KV blocks, repeated prompts sharing the prefix cache, a multimodal prompt
for the thinkers, talker requests whose thinker text streams in over steps). A recompile while serving stalls every
stream of its step for as long as the compile takes.

``torch.compile`` runs with dynamo's eager backend here: the same tracing, guards and recompiles, no inductor compile
time. A compiled runner's greedy answer equals the uncompiled runner's."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from omnipipe.models.qwen2_5_omni import handoff as qwen2_5_handoff
from omnipipe.models.qwen2_5_omni.runners.talker import Qwen25TalkerRunner
from omnipipe.models.qwen2_5_omni.runners.thinker import Qwen25ThinkerRunner
from omnipipe.models.qwen2_5_omni.weights import tiny as qwen2_5_tiny
from omnipipe.models.qwen3_omni import handoff as qwen3_handoff
from omnipipe.models.qwen3_omni.runners.talker import Qwen3TalkerRunner
from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner
from omnipipe.models.qwen3_omni.weights import tiny as qwen3_tiny
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, drive

pytestmark = pytest.mark.slow  # four runners traced and served on tiny checkpoints

FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3_omni": {"tiny": qwen3_tiny, "thinker": Qwen3ThinkerRunner, "talker": Qwen3TalkerRunner,
                   "handoff": qwen3_handoff},
    "qwen2_5_omni": {"tiny": qwen2_5_tiny, "thinker": Qwen25ThinkerRunner, "talker": Qwen25TalkerRunner,
                     "handoff": qwen2_5_handoff},
}
LONG = {"temperature": 0.0, "max_tokens": 40}
TEXTS = [f"question {i}: " + "tell me more " * (2 * i) for i in range(6)]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the stage runs with ``threads: 1`` (and the tests share few cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {family: parts["tiny"].write_tiny_checkpoint(tmp_path_factory.mktemp(family) / "ckpt", seed=0)
            for family, parts in FAMILIES.items()}


@pytest.fixture
def eager_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.compile with dynamo's eager backend, a fresh dynamo (the compiled code of other tests forgotten: the
    recompile limit counts per function, and the families share transformers' wrappers), and a hard failure where
    a function hits that limit (dynamo would otherwise run it uncompiled and count no graph)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


def load(runner_class: type, checkpoint: Path, **options: Any) -> Any:
    runner = runner_class(RunnerContext("stage", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    runner.load()
    return runner


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def media_prompt() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)
    audio = (0.2 * np.sin(np.arange(16000) / 50)).astype(np.float32)
    return {"text": "what do you see and hear", "images": [image], "audios": [audio]}


def thinker_traffic() -> list[list[Arrival]]:
    """Batches of 1, 4 and 6 joining at different steps, prompts of other lengths (the six: two prompts three times
    each, sharing the prefix cache), and a multimodal prompt with a text one joining it."""
    return [
        [Arrival("one", LONG, [{"text": "hello there"}])],
        [Arrival(f"four{i}", LONG, [{"text": TEXTS[i]}], step=step) for i, step in enumerate([0, 1, 3, 4])],
        [Arrival(f"six{i}", {"temperature": 0.0, "max_tokens": 12 + 5 * i}, [{"text": TEXTS[1 + i % 2]}],
                 step=i % 3) for i in range(6)],
        [Arrival("media", LONG, [media_prompt()]), Arrival("text", LONG, [{"text": TEXTS[5]}], step=2)],
    ]


def tokens(result: DriveResult, request_id: str) -> list[int]:
    return [output.data["token"] for output in result.outputs[request_id] if output.data and "token" in output.data]


@pytest.fixture(scope="module")
def thinker_data(checkpoints: dict[str, Path]) -> dict[str, list[list[dict[str, Any]]]]:
    """Each family's uncompiled thinker's step data for six text prompts (8 to 38 tokens) and a multimodal one."""
    data = {}
    for family, parts in FAMILIES.items():
        thinker = load(parts["thinker"], checkpoints[family])
        try:
            items = [*({"text": text} for text in TEXTS), media_prompt()]
            arrivals = [Arrival(f"t{i}", {"temperature": 0.0, "max_tokens": 8 + 6 * i}, [item])
                        for i, item in enumerate(items)]
            result = drive(thinker, arrivals)
        finally:
            thinker.close()
        assert not result.errors
        data[family] = [[o.data for o in result.outputs[a.request_id] if o.data] for a in arrivals]
    return data


def talker_traffic(handoff: Any, data: list[list[dict[str, Any]]]) -> list[list[Arrival]]:
    """Batches of 1, 4 and 6 joining at different steps: whole thinker outputs, thinker text streaming in a step a
    token (as the async-chunk edge sends it), and a multimodal prompt's."""

    def whole(request_id: str, outputs: list[dict[str, Any]], step: int = 0) -> Arrival:
        return Arrival(request_id, LONG, handoff.thinker2talker(outputs), step=step)

    def streamed(request_id: str, outputs: list[dict[str, Any]], step: int) -> Arrival:
        state: dict[str, Any] = {}
        chunks = [chunk for index, output in enumerate(outputs)
                  for chunk in handoff.thinker2talker_async_chunk(state, output, index == len(outputs) - 1, None)]
        return Arrival(request_id, LONG, chunks[:1], step=step,
                       more=[(step + 1 + index, chunk) for index, chunk in enumerate(chunks[1:])])

    return [
        [whole("one", data[0])],
        [whole(f"four{i}", data[i + 1], step) for i, step in enumerate([0, 1, 3, 4])],
        [streamed(f"six{i}", data[i], i) for i in range(6)],
        [streamed("media", data[6], 0), whole("text", data[2], 1)],
    ]


def frames(result: DriveResult, request_id: str) -> list[list[int]]:
    return [output.data["frames"].tolist() for output in result.outputs[request_id]
            if output.data and "frames" in output.data]


def served_without_compiling(runner: Any, traffic: list[list[Arrival]]) -> tuple[int, list[DriveResult]]:
    """Warm ``runner`` up (its KV blocks all free again after), then serve ``traffic``: the graphs compiled while
    serving, and the results."""
    runner.warmup()
    assert runner.kv.free_blocks == runner.kv.num_blocks
    before = graphs()
    results = [drive(runner, arrivals) for arrivals in traffic]
    for result in results:
        assert not result.errors
    return graphs() - before, results


@pytest.mark.parametrize("family", FAMILIES)
def test_a_compiled_thinker_compiles_nothing_after_its_warm_up(family: str, checkpoints: dict[str, Path],
                                                               eager_compile: None) -> None:
    runner_class = FAMILIES[family]["thinker"]
    compiled = load(runner_class, checkpoints[family], torch_compile=True)
    plain = load(runner_class, checkpoints[family])
    try:
        compiled_graphs, results = served_without_compiling(compiled, thinker_traffic())
        longest = max(len(tokens(result, rid)) for result in results for rid in result.outputs)
        assert longest > compiled.kv.block_tokens  # some answers crossed KV blocks
        assert compiled_graphs == 0
        greedy = [Arrival("greedy", {"temperature": 0.0, "max_tokens": 24}, [{"text": TEXTS[3]}])]
        assert tokens(drive(compiled, greedy), "greedy") == tokens(drive(plain, greedy), "greedy")
    finally:
        compiled.close()
        plain.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_compiled_talker_compiles_nothing_after_its_warm_up(family: str, checkpoints: dict[str, Path],
                                                              thinker_data: dict[str, list[list[dict[str, Any]]]],
                                                              eager_compile: None) -> None:
    parts = FAMILIES[family]
    data = thinker_data[family]
    compiled = load(parts["talker"], checkpoints[family], torch_compile=True)
    compiled_graphs, results = served_without_compiling(compiled, talker_traffic(parts["handoff"], data))
    longest = max(len(frames(result, rid)) for result in results for rid in result.outputs)
    assert longest > compiled.kv.block_tokens  # some answers crossed KV blocks
    assert compiled_graphs == 0
    plain = load(parts["talker"], checkpoints[family])

    def greedy() -> list[Arrival]:
        return [Arrival("greedy", {"temperature": 0.0, "max_tokens": 16}, parts["handoff"].thinker2talker(data[3]))]

    assert frames(drive(compiled, greedy()), "greedy") == frames(drive(plain, greedy()), "greedy")
