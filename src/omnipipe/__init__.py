"""omnipipe: serve multi-stage omni-modal models (thinker -> talker -> vocoder), streaming between stages."""

from omnipipe.entrypoints.async_omni import AsyncOmni, RequestFailedError
from omnipipe.entrypoints.omni import Omni
from omnipipe.outputs import OmniRequestOutput, RequestMetrics
from omnipipe.sampling_params import SamplingParams

__all__ = ["AsyncOmni", "Omni", "OmniRequestOutput", "RequestFailedError", "RequestMetrics", "SamplingParams"]
__version__ = "0.1.0"
