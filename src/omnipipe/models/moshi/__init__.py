"""Moshi (Kyutai's full-duplex speech-to-speech model) served as a live duplex stage: every 80 ms frame of the
user's audio in gives one text token of Moshi's inner monologue and one frame of Moshi's own speech codes, decoded
to 24 kHz audio by a Mimi stage; on transformers' own classes."""
