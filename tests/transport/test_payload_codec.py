"""The payload codec and relays round-trip any nesting of arrays and tensors, across dtypes and shapes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from omnipipe.transport import payload_codec
from omnipipe.transport.payload_codec import PayloadCodecError
from omnipipe.transport.relay.inline import InlineRelay
from omnipipe.transport.relay.shm import ShmRelay
from omnipipe.transport.relay_io import read_payload, write_payload

DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "bool", "complex64"]

arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**62, 2**62), st.floats(allow_nan=False),
                    st.text(max_size=20), st.binary(max_size=20))
leaves = st.one_of(scalars, arrays)
keys = st.text(min_size=1, max_size=8).filter(lambda k: k != "__tensor__")
payloads = st.recursive(leaves, lambda children: st.one_of(st.lists(children, max_size=4),
                                                           st.dictionaries(keys, children, max_size=4)), max_leaves=12)


def assert_same(a, b) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@settings(max_examples=150, deadline=None)
@given(payloads)
def test_codec_round_trips_nested_payloads(obj) -> None:
    encoded = payload_codec.encode(obj)
    assert_same(obj, payload_codec.decode(encoded.skeleton, encoded.tensors, encoded.join()))


@pytest.fixture(scope="module")
def shm_pair():
    sender, receiver = ShmRelay("test", "codec-tx", slot_bytes=1 << 16, num_slots=4), ShmRelay("test", "codec-rx")
    yield sender, receiver
    sender.close()
    receiver.close()


@settings(max_examples=100, deadline=None)
@given(payloads)
def test_relays_round_trip_nested_payloads(shm_pair, obj) -> None:
    sender, receiver = shm_pair
    for relay, threshold in ((InlineRelay(), 0), (sender, 0)):
        payload = write_payload(obj, relay, "req", threshold)
        assert_same(obj, read_payload(payload, {"inline": InlineRelay(), "shm": receiver}, "req"))
    assert sender.slots_in_use() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8])
def test_torch_tensors_keep_dtype_and_shape(dtype) -> None:
    tensor = (torch.arange(24).reshape(2, 3, 4) % 5).to(dtype)
    obj = {"hidden": tensor, "nested": [tensor[0], {"t": tensor.permute(2, 1, 0)}]}
    encoded = payload_codec.encode(obj)
    assert_same(obj, payload_codec.decode(encoded.skeleton, encoded.tensors, encoded.join()))


def test_tensor_info_describes_every_tensor() -> None:
    obj = {"a": np.zeros((2, 3), np.float32), "b": [np.ones(5, np.int16)]}
    encoded = payload_codec.encode(obj)
    assert [(t.path, t.dtype, t.shape) for t in encoded.tensors] == [("a", "<f4", [2, 3]), ("b[0]", "<i2", [5])]
    assert all(t.offset % 64 == 0 for t in encoded.tensors)


@pytest.mark.parametrize("bad, match", [
    ({"x": object()}, "x: cannot send a value of type object"),
    ({1: "int key"}, "dict keys must be str"),
    ({"__tensor__": 1}, "reserved"),
    (np.array([object()]), "object arrays"),
])
def test_unsendable_values_are_refused_with_their_path(bad, match) -> None:
    with pytest.raises(PayloadCodecError, match=match):
        payload_codec.encode(bad)


def test_buffer_that_does_not_match_tensor_info_is_refused() -> None:
    encoded = payload_codec.encode({"a": np.zeros(100, np.float32)})
    with pytest.raises(PayloadCodecError, match="outside"):
        payload_codec.decode(encoded.skeleton, encoded.tensors, b"\0" * 10)
    with pytest.raises(PayloadCodecError, match="not valid msgpack"):
        payload_codec.decode(b"\xc1", [], b"")


def test_the_engine_and_stage_processes_import_torch_only_for_a_tensor() -> None:
    """Importing torch takes seconds: the caller's process (CLI, engine, a pipeline's processors) and a stage whose
    runner needs no torch never load it; a tensor that arrives is decoded as a tensor all the same."""
    code = """
import json, sys
import omnipipe.cli.main, omnipipe.engine.async_omni_engine, omnipipe.stage.stage_core_proc
from omnipipe.models.registry import get_pipeline
from omnipipe.transport import payload_codec
from omnipipe.util.dotted import resolve
pipeline = get_pipeline("default")
for edge in pipeline.edges:
    resolve(edge.input_processor)
resolve(pipeline.prompt_processor)
encoded = payload_codec.encode({"audio": __import__("numpy").zeros(4, "float32")})
payload_codec.decode(encoded.skeleton, encoded.tensors, encoded.join())
before = "torch" in sys.modules
skeleton, tensors, data = bytes.fromhex(sys.argv[1]), json.loads(sys.argv[2]), bytes.fromhex(sys.argv[3])
from omnipipe.transport.messages import TensorInfo
decoded = payload_codec.decode(skeleton, [TensorInfo(**t) for t in tensors], data)
print(json.dumps([before, type(decoded["t"]).__module__, str(decoded["t"].dtype), decoded["t"].tolist()]))
"""
    encoded = payload_codec.encode({"t": torch.tensor([1.5, 2.5], dtype=torch.bfloat16)})
    tensors = [{f: getattr(t, f) for f in t.__struct_fields__} for t in encoded.tensors]
    done = subprocess.run([sys.executable, "-c", code, encoded.skeleton.hex(), json.dumps(tensors),
                           encoded.join().hex()], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    before, module, dtype, values = json.loads(done.stdout.strip().splitlines()[-1])
    assert before is False  # nothing so far needed torch
    assert (module, dtype, values) == ("torch", "torch.bfloat16", [1.5, 2.5])
