"""Gateway side of multi-worker serving: worker accounting, a FIFO worker pool and wait-time estimates."""
