"""Async chunk: stages stream chunks to the next stage instead of waiting for whole outputs."""
