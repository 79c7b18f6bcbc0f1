"""Pull every tensor / ndarray out of a nested payload into one contiguous buffer, and put them back.

The skeleton left behind is plain msgpack (dicts, lists, str, int, float, bool, None, bytes); each tensor is
replaced by ``{"__tensor__": index}`` and described by a ``TensorInfo`` (path, dtype, shape, offset, nbytes).
Tuples come back as lists.

With ``keep_device`` (for a relay that moves tensors as objects) no tensor is copied: each one is kept by
reference in ``EncodedPayload.kept`` (its device and storage unchanged) and described by a ``TensorInfo`` of
kind ``"ref"`` whose ``offset`` is its index in that list. Everything else is the same as for byte relays.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from omnipipe.transport.messages import TensorInfo


def _torch_if_imported() -> Any:
    """torch if this process has imported it, else None: a value can only be a tensor once torch is loaded, so the
    codec never imports it to look (importing torch takes seconds; stages and callers without tensors skip it)."""
    return sys.modules.get("torch")


def _torch() -> Any:
    """torch, imported now if need be (a tensor arrived), or None where it is not installed."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency of the package
        return None
    return torch


TENSOR_MARKER = "__tensor__"
_ALIGN_BYTES = 64
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class PayloadCodecError(ValueError):
    """Raised for a payload that cannot be encoded or a buffer that does not match its tensor_info."""


@dataclass
class EncodedPayload:
    skeleton: bytes
    tensors: list[TensorInfo]
    buffers: list[memoryview]  # one per byte tensor, in order, each placed at tensors[i].offset
    nbytes: int
    kept: list[Any] = field(default_factory=list)  # tensors kept by reference (keep_device)

    def join(self) -> bytes:
        """The flat buffer as one bytes object (for inline transport)."""
        out = bytearray(self.nbytes)
        for info, buf in zip(self.byte_tensors, self.buffers, strict=True):
            out[info.offset : info.offset + info.nbytes] = buf
        return bytes(out)

    @property
    def byte_tensors(self) -> list[TensorInfo]:
        """The tensors that travel in the flat buffer (all of them unless some were kept by reference)."""
        return [info for info in self.tensors if info.kind != "ref"]

    def pieces(self) -> list[tuple[int, memoryview]]:
        """(offset, bytes) of every tensor in the flat buffer, as a byte relay's ``put`` takes them."""
        return [(info.offset, buf) for info, buf in zip(self.byte_tensors, self.buffers, strict=True)]


def _torch_dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def encode(obj: Any, keep_device: bool = False) -> EncodedPayload:
    """Split ``obj``. ``keep_device``: keep tensors and arrays by reference instead of copying them to bytes."""
    state = EncodedPayload(b"", [], [], 0)
    skeleton = _encoder.encode(_extract(obj, "", state, keep_device))
    return EncodedPayload(skeleton, state.tensors, state.buffers, state.nbytes, state.kept)


def _keep(value: Any, path: str, dtype_name: str, state: EncodedPayload) -> dict[str, int]:
    state.tensors.append(TensorInfo(path, dtype_name, list(value.shape), len(state.kept), 0, "ref"))
    state.kept.append(value)
    return {TENSOR_MARKER: len(state.tensors) - 1}


def _add(array: np.ndarray, path: str, kind: str, dtype_name: str, state: EncodedPayload) -> dict[str, int]:
    contiguous = array if array.flags.c_contiguous else np.array(array, order="C")
    nbytes = contiguous.nbytes
    state.tensors.append(TensorInfo(path, dtype_name, list(contiguous.shape), state.nbytes, nbytes, kind))
    state.buffers.append(contiguous.reshape(-1).view(np.uint8).data if nbytes else memoryview(b""))
    state.nbytes += (nbytes + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES
    return {TENSOR_MARKER: len(state.tensors) - 1}


def _extract(value: Any, path: str, state: EncodedPayload, keep_device: bool) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise PayloadCodecError(f"{path or '<root>'}: object arrays cannot be sent")
        if keep_device:
            return _keep(value, path, value.dtype.str, state)
        return _add(value, path, "numpy", value.dtype.str, state)
    if isinstance(value, np.generic):
        return value.item()
    torch = _torch_if_imported()
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        if keep_device:
            return _keep(t, path, _torch_dtype_name(t), state)
        if t.device.type != "cpu":
            t = t.cpu()
        name = _torch_dtype_name(t)
        array = t.contiguous().view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.contiguous().numpy()
        return _add(array, path, "torch", name, state)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadCodecError(f"{path or '<root>'}: dict keys must be str, got {type(key).__name__}")
            if key == TENSOR_MARKER:
                raise PayloadCodecError(f"{path or '<root>'}: the key {TENSOR_MARKER!r} is reserved")
            out[key] = _extract(item, f"{path}.{key}" if path else key, state, keep_device)
        return out
    if isinstance(value, (list, tuple)):
        return [_extract(item, f"{path}[{i}]", state, keep_device) for i, item in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool, bytes)):
        return value
    raise PayloadCodecError(f"{path or '<root>'}: cannot send a value of type {type(value).__name__}")


def decode(skeleton: bytes, tensors: list[TensorInfo], buffer: bytes | bytearray | memoryview,
           kept: list[Any] | None = None) -> Any:
    """Rebuild the nested object. Arrays are views into ``buffer`` (no copy); keep it alive and read-only.
    ``kept``: the tensors a ``keep_device`` relay handed over, for the ``"ref"`` entries."""
    view = memoryview(buffer).cast("B") if not isinstance(buffer, memoryview) else buffer.cast("B")
    restored: list[Any] = []
    for info in tensors:
        if info.kind == "ref":
            if kept is None or not 0 <= info.offset < len(kept):
                raise PayloadCodecError(f"{info.path}: no tensor was handed over for it")
            restored.append(kept[info.offset])
            continue
        end = info.offset + info.nbytes
        if info.offset < 0 or end > len(view):
            raise PayloadCodecError(f"{info.path}: tensor bytes [{info.offset}, {end}) outside a {len(view)}-byte "
                                    "buffer")
        if info.kind == "torch":
            restored.append(_restore_torch(view[info.offset : end], info))
        elif info.kind == "numpy":
            dtype = np.dtype(info.dtype)
            array = np.frombuffer(view[info.offset : end], dtype=dtype) if info.nbytes else np.empty(0, dtype)
            restored.append(_reshape(array, info))
        else:
            raise PayloadCodecError(f"{info.path}: unknown tensor kind {info.kind!r}")

    try:
        tree = _decoder.decode(skeleton)
    except msgspec.DecodeError as exc:
        raise PayloadCodecError(f"payload skeleton is not valid msgpack: {exc}") from exc
    return _restore(tree, restored)


def _restore(value: Any, restored: list[Any]) -> Any:
    # a plain recursive function, not a closure: a self-referencing closure would keep ``restored`` (and any
    # zero-copy relay slot under it) alive until the cycle collector runs
    if isinstance(value, dict):
        if len(value) == 1 and TENSOR_MARKER in value:
            index = value[TENSOR_MARKER]
            if not isinstance(index, int) or not 0 <= index < len(restored):
                raise PayloadCodecError(f"tensor placeholder {index!r} has no tensor_info")
            return restored[index]
        return {k: _restore(v, restored) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, restored) for v in value]
    return value


def _reshape(array: np.ndarray, info: TensorInfo) -> np.ndarray:
    expected = int(np.prod(info.shape)) if info.shape else 1
    if array.size != expected:
        raise PayloadCodecError(f"{info.path}: {array.size} elements do not fit shape {info.shape}")
    return array.reshape(info.shape)


def _restore_torch(raw: memoryview, info: TensorInfo) -> Any:
    torch = _torch()
    if torch is None:
        raise PayloadCodecError(f"{info.path}: a torch tensor was sent but torch is not installed")
    name = info.dtype
    if name == "bfloat16":
        array = _reshape(np.frombuffer(raw, dtype=np.int16) if info.nbytes else np.empty(0, np.int16), info)
        return torch.from_numpy(array.copy()).view(torch.bfloat16)
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise PayloadCodecError(f"{info.path}: unknown torch dtype {name!r}")
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    array = _reshape(np.frombuffer(raw, dtype=np_dtype) if info.nbytes else np.empty(0, np_dtype), info)
    # torch.from_numpy needs a writable array; copy only for read-only views (e.g. bytes buffers)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)
