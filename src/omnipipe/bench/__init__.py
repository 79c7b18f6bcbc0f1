"""Benchmarks: ``python -m omnipipe.bench.engine`` for the engine itself; ``report`` holds the shared helpers."""
