"""CSM (Sesame's conversational speech model) served as two stages: a Llama backbone that writes each 12.5 Hz frame's
first Mimi codebook with a small depth decoder writing the others, then Mimi decoding the frames to 24 kHz audio, on
transformers' own classes."""
