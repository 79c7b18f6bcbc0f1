"""Taps: the traffic the gateway proxies, turned into ``SessionRecorder`` calls, one module per protocol.

The gateway hands a tap what passes through it: raw realtime frames, request bodies, SSE payloads, response
bytes. A tap never raises (``base.never_raises``): input it cannot make sense of is logged and left out of the
recording, so recording can never break the session it records. Latency metrics are ``ttft_ms`` (first text) and
``ttfp_ms`` (first audio), measured from the start of the response: ``response.created`` on the realtime socket,
the call to ``on_request`` for HTTP.
"""

from omnipipe.gateway.recording.taps.base import HttpTap
from omnipipe.gateway.recording.taps.chat import ChatTap
from omnipipe.gateway.recording.taps.realtime import RealtimeTap
from omnipipe.gateway.recording.taps.speech import SpeechTap
from omnipipe.gateway.recording.taps.transcription import TranscriptionTap, TurnTranscriptTap, transcript_text

__all__ = ["ChatTap", "HttpTap", "RealtimeTap", "SpeechTap", "TranscriptionTap", "TurnTranscriptTap",
           "transcript_text"]
