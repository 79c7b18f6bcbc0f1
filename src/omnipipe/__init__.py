"""omnipipe: serve multi-stage omni-modal models (thinker -> talker -> vocoder), streaming between stages."""

from omnipipe.api.async_omni import AsyncOmni, RequestFailedError
from omnipipe.api.omni import Omni
from omnipipe.api.outputs import OmniRequestOutput, RequestMetrics
from omnipipe.api.sampling_params import SamplingParams

__all__ = ["AsyncOmni", "Omni", "OmniRequestOutput", "RequestFailedError", "RequestMetrics", "SamplingParams"]
__version__ = "0.1.0"
