"""omnipipe: serve multi-stage omni-modal models (thinker -> talker -> vocoder), streaming between stages.

The public names are loaded on first use (PEP 562), so importing a light subpackage such as
``omnipipe.gateway`` or ``omnipipe.protocol`` does not pull in torch, zmq or the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnipipe.api.async_omni import AsyncOmni, RequestFailedError, StageLostError
    from omnipipe.api.omni import Omni
    from omnipipe.api.outputs import OmniRequestOutput, RequestMetrics
    from omnipipe.api.sampling_params import SamplingParams

_LAZY: dict[str, str] = {
    "AsyncOmni": "omnipipe.api.async_omni",
    "RequestFailedError": "omnipipe.api.async_omni",
    "StageLostError": "omnipipe.api.async_omni",
    "Omni": "omnipipe.api.omni",
    "OmniRequestOutput": "omnipipe.api.outputs",
    "RequestMetrics": "omnipipe.api.outputs",
    "SamplingParams": "omnipipe.api.sampling_params",
}

__all__ = ["AsyncOmni", "Omni", "OmniRequestOutput", "RequestFailedError", "RequestMetrics", "SamplingParams",
           "StageLostError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'omnipipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
