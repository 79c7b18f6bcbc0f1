"""Voxtral served as one stage: a Whisper-style audio encoder per 30 s window, four frames stacked and projected
into a Llama language model that answers about the audio or transcribes it, on transformers' own classes."""
