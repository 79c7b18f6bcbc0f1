"""Kyutai's Mimi codec (transformers' ``MimiModel``) as a shared streaming stage: the codec of CSM and Moshi. An
exact streaming decoder and encoder per request (``modeling/stream.py``), the decoder stage that turns frame-edge
chunks of codes into 24 kHz audio (``runners/decoder.py``), its load from a Mimi, CSM or Moshi checkpoint
(``weights/load.py``), and the tiny random Mimi those families' tiny checkpoints build on (``weights/tiny.py``)."""
