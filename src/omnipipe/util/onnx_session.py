"""One onnxruntime session per model file for the whole process, on one CPU thread: the small stateless models the
server runs for every connection (the speech VAD, the end-of-turn model) share it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

_sessions: dict[Path, Any] = {}
_lock = threading.Lock()


def shared_cpu_session(path: Path) -> Any:
    """The process's session of the ONNX model at ``path`` (made on first use; quiet logs)."""
    with _lock:
        if path not in _sessions:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.inter_op_num_threads = 1
            options.intra_op_num_threads = 1
            options.log_severity_level = 4
            _sessions[path] = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"],
                                                           sess_options=options)
        return _sessions[path]
