"""A stage process's device: which one each rank computes on, checked against the GPUs this process sees, and
made current before anything runs there.

Placement ``local`` starts every rank on the host with all its GPUs visible: a stage on ``cuda:K`` with N ranks
takes ``cuda:K`` .. ``cuda:K+N-1`` (``tensor_parallel.rank_device``). Placement ``ray`` gives each rank actor GPUs of
its own and Ray sets ``CUDA_VISIBLE_DEVICES`` to them, so the rank sees the first as ``cuda:0`` whatever the
configured index (which does not pick a GPU there: Ray does). ``enter_device`` refuses a device this process
cannot use with the deploy key in the error (``stages.<name>.device``), makes it current (CUDA's current device
is per thread: threads that touch a GPU on their own, such as the nccl relay's, are told the device too) and lets
float32 matmuls use TF32 there. ``is_sticky_cuda_error`` says which errors leave the process's CUDA context broken
for good (the step then exits the process so the engine restarts the stage).
"""

from __future__ import annotations

import logging
import sys

from omnipipe.config.deploy_knobs import check_device_present
from omnipipe.stage.tensor_parallel import rank_device

logger = logging.getLogger(__name__)

def stage_device(device: str, rank: int, placed_gpus: bool) -> str:
    """The device rank ``rank`` of a stage configured with ``device`` computes on, as this process names it;
    ``placed_gpus``: the placement gave the rank GPUs of its own, visible to it from ``cuda:0`` (Ray)."""
    if not device.startswith("cuda"):
        return device
    return "cuda:0" if placed_gpus else rank_device(device, rank)


def enter_device(stage: str, device: str) -> None:
    """Refuse a CUDA ``device`` this process has not (naming ``stages.<stage>.device``), else make it this
    process's current device, with TF32 for float32 matmuls and convolutions and without cuDNN's attention kernel;
    nothing for the CPU."""
    if not device.startswith("cuda"):
        return
    check_device_present(device, f"stages.{stage}.device")
    import torch

    torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")  # TF32 tensor cores for float32 matmuls
    torch.backends.cudnn.allow_tf32 = True
    # cuDNN's attention plans a graph for every new shape on the host (12 ms a call measured on an H200, where the
    # whole decode step's GPU work is under 2 ms): the other SDPA kernels take the paged cache's masks as they are
    torch.backends.cuda.enable_cudnn_sdp(False)
    logger.info("computing on %s (%s)", device, torch.cuda.get_device_name(device))


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a CUDA error, after which this process's CUDA context
    is not to be trusted again: a device-side assert or an illegal address poisons it for good, and torch raises
    them from the next call, whatever it is (``torch.AcceleratorError``, or a ``RuntimeError`` saying "CUDA error:
    ..."). Out-of-memory errors are not: the next step may fit."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _is_cuda_error(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _is_cuda_error(error: BaseException) -> bool:
    message = str(error)
    if "out of memory" in message:
        return False
    torch = sys.modules.get("torch")  # a stage that never loaded torch never met a CUDA error
    accelerator_error = getattr(torch, "AcceleratorError", None) if torch is not None else None
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return "CUDA error" in message or "device-side assert" in message
