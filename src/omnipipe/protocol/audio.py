"""Audio on the wire: OpenAI's headerless ``pcm``/``pcm16`` is 24 kHz mono int16 little-endian.

The server streams it (``/v1/audio/speech``, chat audio deltas, realtime ``response.audio.delta``) and reads it
(realtime ``input_audio_buffer.append``); the gateway's recording taps read the same bytes back. Imports nothing.
"""

from __future__ import annotations

PCM16_RATE_HZ = 24_000
"""Sample rate of headerless ``pcm``/``pcm16`` audio, both directions."""
PCM16_DTYPE = "<i2"
"""numpy dtype of one ``pcm16`` sample: little-endian int16, mono."""
PCM16_SAMPLE_BYTES = 2
PCM16_MEDIA_TYPE = "audio/pcm"
