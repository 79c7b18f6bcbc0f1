"""Voxtral Realtime served as one stage: a causal streaming audio encoder (causal convolutions, sliding-window
attention) whose one embedding per 80 ms is added to every text position of a Mistral-like language model
conditioned on its transcription delay; it transcribes as the audio comes, on transformers' own classes."""
