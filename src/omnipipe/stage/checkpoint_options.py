"""The options a stage running part of a model checkpoint takes (deploy ``stages.<name>.options``), shared by the
families that load transformers checkpoints: ``model`` (the checkpoint directory; the CLI's ``--model DIR`` sets it),
``dtype`` (``auto``: bfloat16 on CUDA, float32 elsewhere), ``gpu_memory_fraction`` (0 < f <= 1 of its CUDA device's
memory, for stages sharing a GPU; CUDA only) and, for a stage with a decoder, ``torch_compile``. A family subclasses
these with its stages' own options; ``checked_options`` refuses unknown keys and names the key of every error.
``quiet_loading`` keeps transformers' progress bars and load reports out of a stage's log; ``device_on_load``
loads a part straight onto its GPU."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.streaming_audio import MAX_OPEN_STREAMS
from omnipipe.util.field_error import FieldError
from omnipipe.util.options import options_from_dict

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Options = TypeVar("Options", bound="CheckpointOptions")


@dataclass(frozen=True)
class CheckpointOptions:
    """``step_per_request``: run each request of a batch in its own runner call (one forward each), as an unbatched
    stage would; read by the stage loop, only for comparing against the batched steps (``omnipipe bench``)."""

    model: str = ""
    dtype: str = "auto"
    gpu_memory_fraction: float | None = None
    step_per_request: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise FieldError("model", "must name a checkpoint directory (config.json + *.safetensors); "
                             "`omnipipe tiny-checkpoint FAMILY DIR` writes a tiny one")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise FieldError("dtype", f"must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        value = self.gpu_memory_fraction
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
            raise FieldError("gpu_memory_fraction", f"must be a number in (0, 1], got {value!r}")
        if not isinstance(self.step_per_request, bool):
            raise FieldError("step_per_request", f"must be true or false, got {self.step_per_request!r}")

    def torch_dtype(self, device: str) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.startswith("cuda") else torch.float32
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class DecoderCheckpointOptions(CheckpointOptions):
    """A stage whose decoder steps its requests together (``stage/kv_cache.py``):

    - ``torch_compile``: compile the decoder's forward (dynamic shapes); off by default (on a CPU the compile costs
      more than it saves at these step sizes).
    - ``kv_cache_bytes``: the KV cache's budget, reserved at start; by default ``DEFAULT_CPU_KV_BYTES`` on a CPU, and
      on CUDA what ``gpu_memory_fraction`` (else 0.9) of the device leaves once the weights are loaded and one step's
      activations are set aside (``kv_cache.step_activation_bytes``), and never more than the device has free then;
      either way no more than ``max_num_seqs`` requests of the model's whole context (``max_position_embeddings``)
      and the stage's default reply cap fill. A request is admitted when its prompt and ``max_tokens`` fit what is
      free; until then it waits.
    - ``kv_block_tokens``: tokens per block of that cache.
    - ``prefill_chunk_tokens``: at most that many prompt tokens prefilled in one step; a longer prompt is prefilled
      in pieces with the running requests' decode steps in between, so an arrival never freezes their streams.
    - ``prefix_caching``: a prompt's leading blocks that an earlier request computed are shared, not prefilled
      again (``kv_cache.py``); on by default.
    - ``paged_attention``: the name of a paged attention kernel (``paged_attention.py``: ``reference``, or one a
      plugin registered) that reads the cache's blocks itself; unset, the cache gathers each row's history for the
      model's own attention."""

    torch_compile: bool = False
    prefix_caching: bool = True
    paged_attention: str | None = None
    kv_cache_bytes: int | None = None
    kv_block_tokens: int = 16
    prefill_chunk_tokens: int = 2048

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("torch_compile", "prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise FieldError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.kv_cache_bytes is not None:
            positive_int("kv_cache_bytes", self.kv_cache_bytes, 1 << 50)
        positive_int("kv_block_tokens", self.kv_block_tokens, 1024)
        positive_int("prefill_chunk_tokens", self.prefill_chunk_tokens, 1 << 20)
        if self.paged_attention is not None:
            from omnipipe.stage.paged_attention import KERNELS

            if not isinstance(self.paged_attention, str) or self.paged_attention not in KERNELS:
                raise FieldError("paged_attention", f"must name a registered kernel ({', '.join(sorted(KERNELS))}), "
                                 f"got {self.paged_attention!r}")

    def kv_budget(self, device: str, activation_bytes: int) -> KVBudget:
        """What the stage's KV cache may take (call once the weights are loaded), and how that was reckoned;
        ``activation_bytes`` is kept free on a GPU for the steps themselves (``kv_cache.step_activation_bytes``)."""
        if self.kv_cache_bytes is not None:
            return KVBudget(int(self.kv_cache_bytes), f"kv_cache_bytes {self.kv_cache_bytes}")
        if not device.startswith("cuda"):
            return KVBudget(DEFAULT_CPU_KV_BYTES, f"{gib(DEFAULT_CPU_KV_BYTES)} on the CPU by default")
        index = torch.device(device)
        free, total = torch.cuda.mem_get_info(index)
        return gpu_kv_budget(device, total, self.gpu_memory_fraction or DEFAULT_GPU_MEMORY_FRACTION,
                             torch.cuda.memory_allocated(index), free, activation_bytes)


@dataclass(frozen=True)
class KVBudget:
    bytes: int
    reckoning: str  # how it was reckoned, for the message of a budget too small


def gpu_kv_budget(device: str, total: int, fraction: float, allocated: int, free: int,
                  activation_bytes: int) -> KVBudget:
    """A GPU stage's KV budget: its share of the device (``fraction`` x ``total``) less what it holds already (its
    weights, ``allocated``) and ``activation_bytes`` for its steps, and never more than the device has ``free`` less
    those activations: other processes on the same GPU (the stages that share it) keep what they hold."""
    share = int(total * fraction) - allocated - activation_bytes
    available = free - activation_bytes
    budget = max(0, min(share, available))
    reckoning = (f"{fraction:g} x {gib(total)} of {device} = {gib(int(total * fraction))}, less {gib(allocated)} of "
                 f"weights and {gib(activation_bytes)} kept for one step's activations")
    if available < share:
        reckoning += f"; only {gib(free)} of the device is free (other processes hold the rest)"
    return KVBudget(budget, reckoning)


def gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"


DEFAULT_CPU_KV_BYTES = 1 << 30
DEFAULT_GPU_MEMORY_FRACTION = 0.9


def positive_int(name: str, value: object, most: int) -> None:
    """A FieldError naming ``name`` unless ``value`` is an integer in [1, ``most``]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise FieldError(name, f"must be an integer in [1, {most}], got {value!r}")


@dataclass(frozen=True)
class MultimodalThinkerOptions(DecoderCheckpointOptions):
    """A thinker reading text, images, audio and video: ``max_new_tokens``, a request's cap when its SamplingParams
    leave ``max_tokens`` out; ``video_fps``, frames per second sampled from a video file (and the rate frames given
    as frames are taken to have: it sets the videos' time positions); ``video_max_frames``, at most that many frames
    of one video, spread evenly; ``audio_streams``, the input-audio streams the thinker keeps open at once
    (``stage/streaming_audio.py``: a realtime session's speech, processed as it is appended), 0 for none (every
    clip then comes whole at its commit, as from a client that sends files)."""

    max_new_tokens: int = 1024
    video_fps: float = 2.0
    video_max_frames: int = 64
    audio_streams: int = MAX_OPEN_STREAMS

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)
        positive_int("video_max_frames", self.video_max_frames, 1024)
        streams = self.audio_streams
        if isinstance(streams, bool) or not isinstance(streams, int) or not 0 <= streams <= 1024:
            raise FieldError("audio_streams", f"must be an integer in [0, 1024], got {streams!r}")
        fps = self.video_fps
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 120:
            raise FieldError("video_fps", f"must be a number in (0, 120], got {fps!r}")


def checked_options(context: RunnerContext, schema: type[Options]) -> tuple[Options, Path, torch.dtype]:
    """A stage's options checked against ``schema``, its checkpoint directory (it has a config.json) and dtype; its
    GPU memory share applied."""
    where = f"stages.{context.stage}.options"
    options = options_from_dict(schema, context.options, where)
    directory = Path(options.model).expanduser()
    if not (directory / "config.json").is_file():
        raise FieldError(f"{where}.model", f"{str(directory)!r} is not a checkpoint directory: it has no config.json")
    if not any(directory.glob("*.safetensors")):
        raise FieldError(f"{where}.model", f"{str(directory)!r} has no *.safetensors weights")
    if options.gpu_memory_fraction is not None:
        if not context.device.startswith("cuda"):
            raise FieldError(f"{where}.gpu_memory_fraction",
                             f"limits a CUDA device's memory; this stage runs on {context.device!r}")
        torch.cuda.set_per_process_memory_fraction(float(options.gpu_memory_fraction), torch.device(context.device))
    return options, directory, options.torch_dtype(context.device)


def device_on_load(device: str | torch.device) -> dict[str, Any]:
    """transformers ``from_pretrained`` keywords that load a part's weights straight onto a CUDA ``device`` (a
    released thinker never sits whole in host memory first); none on the CPU, which loads as it always did."""
    return {"device_map": str(device)} if str(device).startswith("cuda") else {}


def compile_if(module: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    """Compile ``module``'s forward with torch.compile (dynamic shapes) when ``enabled``. Its tensor arguments are
    made contiguous first: a prompt's piece is a slice of the whole prompt's tensors, and a compiled graph guards
    its inputs' strides, so a slice would compile another graph for a shape it already has."""
    if enabled:
        compiled = torch.compile(module.forward, dynamic=True)

        @functools.wraps(module.forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return compiled(*(_contiguous(value) for value in args),
                            **{name: _contiguous(value) for name, value in kwargs.items()})

        module.forward = forward
    return module


def _contiguous(value: Any) -> Any:
    """A tensor (or each tensor of a list or tuple of them) with the strides of a fresh one of its shape (a copy if
    it has others, even along dims of size 1, which ``Tensor.contiguous`` leaves as they are); anything else as it
    is."""
    if isinstance(value, torch.Tensor):
        if value.stride() == torch.empty(value.shape, device="meta").stride():
            return value
        return torch.empty(value.shape, dtype=value.dtype, device=value.device).copy_(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, torch.Tensor) for item in value):
        return type(value)(_contiguous(item) for item in value)
    return value


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' progress bars and load report off while a stage loads its part of a checkpoint (the report
    lists the other parts' tensors as unexpected, and tensors the family fills itself as missing)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()
