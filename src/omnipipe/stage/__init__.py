"""One process per stage: control loop, schedulers, and the runner a model family implements."""
