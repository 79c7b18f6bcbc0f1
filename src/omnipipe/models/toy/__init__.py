"""Small deterministic torch stages for engine tests and benchmarks.

thinker (AR, KV cache) copies the prompt upper-cased, one character per step; talker (generation) turns text
into 8-dim frames, ``frames_per_char`` per character; code2wav (generation) is a causal conv vocoder, 32 samples
per frame at 8 kHz. Every output is a pure function of the prompt, so routing, ordering, batching and chunking
can be asserted exactly. ``step_delay_ms`` options stand in for model compute in benchmarks.
"""
