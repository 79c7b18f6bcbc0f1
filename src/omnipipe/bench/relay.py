"""Relay throughput between two processes, per backend, beside memcpy and (for mooncake) raw Mooncake transfers.

    omnipipe bench relay [--backend mooncake shm inline] [--sizes 1MiB 64MiB] [--iterations 100 20] [--json PATH]

Each transfer is the real path of a stage's output: ``write_payload`` in this process, the control message over
ZMQ ipc://, ``read_payload`` in a peer process; one at a time, each waiting for the receiver's answer. Beside it:
an in-process ``np.copyto`` of the same size (the physical limit of a copy), and for ``--backend mooncake`` raw
Mooncake ``transfer_sync_read`` calls of the same size between the same two processes (what the mooncake relay
uses under the hood, with no copy in, no control message and no acknowledgement), and shm, side by side.
The engine benchmark's relay section (``bench/engine.py``) runs the shm and inline rows of this.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from omnipipe.bench.peer import STOP, Peer, connect_peer, human_bytes, ms, run_peer
from omnipipe.bench.report import format_table, machine_info, mean, median, percentile, write_json
from omnipipe.transport import control_plane
from omnipipe.transport.messages import StageOutput
from omnipipe.transport.relay import mooncake, torch_dist
from omnipipe.transport.relay.base import Relay
from omnipipe.transport.relay.inline import InlineRelay
from omnipipe.transport.relay.shm import ShmRelay, segment_prefix, sweep_segments
from omnipipe.transport.relay_io import read_payload, write_payload

SHM_TARGET_PCT_OF_MEMCPY = 40.0  # the whole transfer: two copies (into the slot, out of it) bound a copying one at 50%
SHM_READ_TARGET_PCT_OF_MEMCPY = 60.0  # the copying receive alone (read_payload): one copy out of the slot
MOONCAKE_TARGET_PCT_OF_RAW = 85.0  # the mooncake relay end to end against raw Mooncake reads, at the largest size
ONE_OFF_SLOT_BYTES = 4096  # a pool this small sends every measured payload through a one-off segment
# what the engine benchmark's relay section runs
ENGINE_PATHS = ("inline", "shm", "shm one-off", "shm zero-copy", "gloo")
# what each --backend adds to the run, in order
BACKEND_PATHS = {"inline": ("inline",), "shm": ("shm", "shm one-off", "shm zero-copy"),
                 "mooncake": ("mooncake raw", "mooncake", "shm"), "gloo": ("gloo", "shm")}
_RAW = b"raw"  # a peer frame starting with this is a raw Mooncake read request, not a control message
_ack = msgspec.msgpack.Encoder()
_ack_decoder = msgspec.msgpack.Decoder()


def paths_for(backends: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(path for backend in backends for path in BACKEND_PATHS[backend]))


# ====================================================================== the receiving peer
class _RawReader:
    """The peer's raw Mooncake end: one engine and one registered buffer, grown as sizes need."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.buffer: np.ndarray | None = None

    def read(self, session: str, addr: int, nbytes: int) -> dict[str, Any]:
        if self.engine is None:
            self.engine, _ = mooncake.new_engine("127.0.0.1", "tcp")
        if self.buffer is None or self.buffer.nbytes < nbytes:
            if self.buffer is not None:
                self.engine.unregister_memory(self.buffer.ctypes.data)
            self.buffer = np.zeros(nbytes, dtype=np.uint8)  # zeros + the write below: every page faulted in
            self.buffer.fill(1)
            if self.engine.register_memory(self.buffer.ctypes.data, nbytes) != 0:
                raise RuntimeError("raw mooncake: could not register the receive buffer")
        start = time.perf_counter()
        rc = self.engine.transfer_sync_read(session, self.buffer.ctypes.data, addr, nbytes)
        seconds = time.perf_counter() - start
        if rc < 0:
            raise RuntimeError(f"raw mooncake read failed: code {rc}")
        words = self.buffer[:nbytes].view(np.float32)
        return {"seconds": seconds, "first": float(words[0]), "last": float(words[-1])}

    def close(self) -> None:
        if self.engine is not None and self.buffer is not None:
            self.engine.unregister_memory(self.buffer.ctypes.data)
        self.engine = self.buffer = None


def relay_receiver_peer(to_peer: str, from_peer: str, run_id: str) -> None:
    """Receive StageOutputs, read their payloads, and answer with the timestamps and a content check (and serve raw
    Mooncake read requests)."""
    ctx, pull, push = connect_peer(to_peer, from_peer)
    relays: dict[str, Relay] = {"inline": InlineRelay(), "shm": ShmRelay(run_id, "bench-rx"),
                                "mooncake": mooncake.make_receiver(run_id, "bench-rx", False),
                                "gloo": torch_dist.make_gloo_receiver(run_id, "bench-rx", False)}
    # what stages use for incoming chunks: read in place, the slot is freed when the data is dropped
    zero_copy: dict[str, Relay] = {"shm": ShmRelay(run_id, "bench-rxz", zero_copy=True)}
    raw = _RawReader()
    try:
        while True:
            frame = pull.recv()
            received = time.perf_counter()
            if frame == STOP:
                return
            if frame.startswith(_RAW):
                request = _ack_decoder.decode(frame[len(_RAW):])
                push.send(_ack.encode(raw.read(request["session"], request["addr"], request["nbytes"])))
                continue
            msg = control_plane.decode(control_plane.FROM_STAGE, frame, "bench relay")
            decoded = time.perf_counter()
            if not isinstance(msg, StageOutput) or msg.payload is None:
                raise RuntimeError("benchmark relay peer got something other than a StageOutput with a payload")
            body = read_payload(msg.payload, zero_copy if msg.request_id.startswith("zc") else relays,
                                msg.request_id)
            read = time.perf_counter()
            array = body["x"]
            push.send(_ack.encode({"received": received, "decoded": decoded, "read": read,
                                   "first": float(array[0]), "last": float(array[-1]), "size": int(array.size)}))
            del body, array, msg, frame
    finally:
        for relay in [*relays.values(), *zero_copy.values()]:
            relay.close()
        raw.close()
        pull.close(0)
        push.close(0)
        ctx.term()


# ====================================================================== the sending end
def _memcpy_seconds(nbytes: int, iterations: int) -> list[float]:
    src = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault every page in before timing
    times = []
    for _ in range(iterations + 2):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return times[2:]


class _RelayPath:
    """One relay's transfers: ``write_payload`` here, the control message, ``read_payload`` in the peer.

    Phases per transfer, in seconds, adding up to ``total``: ``write`` (sender write_payload), ``send`` (encode,
    ZMQ send and delivery until the receiver's recv returns), ``decode`` (receiver msgspec decode), ``read``
    (receiver read_payload). perf_counter is CLOCK_MONOTONIC, so the two processes' stamps compare.
    """

    def __init__(self, relay: Relay, array: np.ndarray, id_prefix: str) -> None:
        self.relay, self.array, self.id_prefix = relay, array, id_prefix
        self.phases: dict[str, list[float]] = {k: [] for k in ("total", "write", "send", "decode", "read")}

    def transfer(self, peer: Peer, i: int, timed: bool) -> None:
        array, request_id = self.array, f"{self.id_prefix}{i}"
        array[0], array[-1] = i, -i
        start = time.perf_counter()
        payload = write_payload({"x": array}, self.relay, request_id, inline_threshold_bytes=0)
        written = time.perf_counter()
        peer.push.send(control_plane.encode(StageOutput(request_id, "bench", False, payload=payload)), copy=False)
        ack = _ack_decoder.decode(peer.recv())
        if ack["first"] != i or ack["last"] != -i or ack["size"] != array.size:
            raise RuntimeError(f"relay {self.relay.name}: the receiver read the wrong bytes (iteration {i})")
        if timed:
            self.phases["total"].append(ack["read"] - start)
            self.phases["write"].append(written - start)
            self.phases["send"].append(ack["received"] - written)
            self.phases["decode"].append(ack["decoded"] - ack["received"])
            self.phases["read"].append(ack["read"] - ack["decoded"])

    def close(self) -> None:
        self.relay.close()


class _RawMooncakePath:
    """The peer reads ``nbytes`` from a buffer this process registered, with one ``transfer_sync_read`` each,
    timed around that call alone."""

    def __init__(self, nbytes: int) -> None:
        self.engine, self.session = mooncake.new_engine("127.0.0.1", "tcp")
        self.source = np.random.default_rng(1).random(nbytes // 4, dtype=np.float32)
        if self.engine.register_memory(self.source.ctypes.data, self.source.nbytes) != 0:
            raise RuntimeError("raw mooncake: could not register the source buffer")
        self.phases: dict[str, list[float]] = {"total": []}

    def transfer(self, peer: Peer, i: int, timed: bool) -> None:
        source = self.source
        source[0], source[-1] = i, -i
        peer.push.send(_RAW + _ack.encode({"session": self.session, "addr": source.ctypes.data,
                                           "nbytes": source.nbytes}))
        ack = _ack_decoder.decode(peer.recv())
        if ack["first"] != i or ack["last"] != -i:
            raise RuntimeError(f"raw mooncake: the peer read the wrong bytes (iteration {i})")
        if timed:
            self.phases["total"].append(ack["seconds"])

    def close(self) -> None:
        self.engine.unregister_memory(self.source.ctypes.data)
        self.engine = None


def bench_relay_throughput(sizes: Sequence[int], iterations: Sequence[int],
                           paths: Sequence[str] = ENGINE_PATHS) -> dict[str, Any]:
    """Every path in ``paths`` (see ``BACKEND_PATHS``) at every size, one peer process for all of them. At each
    size the paths take turns, one transfer each, so a change in the machine's load falls on all of them alike."""
    run_id = f"bench{uuid.uuid4().hex[:8]}"
    slot_bytes = max(sizes)
    # each sender relay gets its own owner name: a receiver keeps its mapping of a pool by segment name
    makers: dict[str, Callable[[str], Relay]] = {
        "inline": lambda owner: InlineRelay(),
        "shm": lambda owner: ShmRelay(run_id, owner, slot_bytes=slot_bytes, num_slots=2),
        "shm one-off": lambda owner: ShmRelay(run_id, owner, slot_bytes=ONE_OFF_SLOT_BYTES, num_slots=1),
        "shm zero-copy": lambda owner: ShmRelay(run_id, owner, slot_bytes=slot_bytes, num_slots=2),
        "mooncake": lambda owner: mooncake.MooncakeRelay(run_id, owner, slot_bytes=slot_bytes, num_slots=2),
        # keeps the array an object: its read is a pull over a 2-process gloo group (the first joins the group)
        "gloo": lambda owner: torch_dist.make_gloo_sender(run_id, owner, {}),
    }
    unknown = [p for p in paths if p not in makers and p != "mooncake raw"]
    if unknown:
        raise ValueError(f"unknown relay paths {unknown}")
    memcpy: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    warmup = 2
    try:
        with run_peer(relay_receiver_peer, run_id) as peer:
            for nbytes, count in zip(sizes, iterations, strict=True):
                copies = _memcpy_seconds(nbytes, count)
                memcpy_gbps = nbytes / median(copies) / 1e9
                memcpy.append({"size_bytes": nbytes, "median_ms": ms(median(copies)), "gbps": memcpy_gbps,
                               "best_gbps": nbytes / min(copies) / 1e9})
                array = np.random.default_rng(1).random(nbytes // 4, dtype=np.float32)
                runs: dict[str, _RelayPath | _RawMooncakePath] = {}
                try:
                    for name in paths:
                        runs[name] = (_RawMooncakePath(nbytes) if name == "mooncake raw" else
                                      _RelayPath(makers[name](f"tx{nbytes}-{len(runs)}"), array,
                                                 "zc" if "zero-copy" in name else "r"))
                    for i in range(warmup + count):
                        for run in runs.values():
                            run.transfer(peer, i, timed=i >= warmup)
                finally:
                    for run in runs.values():
                        run.close()
                for name, run in runs.items():
                    phases = run.phases
                    total = phases["total"]
                    gbps = nbytes / median(total) / 1e9
                    rows.append({
                        "size_bytes": nbytes, "backend": name, "iterations": count, "gbps": gbps,
                        "best_gbps": nbytes / min(total) / 1e9, "pct_of_memcpy": 100 * gbps / memcpy_gbps,
                        "read_pct_of_memcpy": (100 * nbytes / median(phases["read"]) / 1e9 / memcpy_gbps
                                               if "read" in phases else None),
                        "median_ms": ms(median(total)), "mean_ms": ms(mean(total)),
                        "p99_ms": ms(percentile(total, 99)),
                        "phases_mean_ms": {k: ms(mean(v)) for k, v in phases.items() if k != "total"},
                        "samples_ms": [ms(t) for t in total],
                    })
    finally:
        sweep_segments(segment_prefix(run_id))
    raw = {r["size_bytes"]: r for r in rows if r["backend"] == "mooncake raw"}
    mooncake_vs_raw = [{"size_bytes": r["size_bytes"], "relay_gbps": r["gbps"],
                        "raw_gbps": raw[r["size_bytes"]]["gbps"],
                        "pct_of_raw": 100 * r["gbps"] / raw[r["size_bytes"]]["gbps"]}
                       for r in rows if r["backend"] == "mooncake" and r["size_bytes"] in raw]
    return {"pool_slot_bytes": slot_bytes, "one_off_slot_bytes": ONE_OFF_SLOT_BYTES, "memcpy": memcpy, "rows": rows,
            "mooncake_vs_raw": mooncake_vs_raw, "target_mooncake_pct_of_raw": MOONCAKE_TARGET_PCT_OF_RAW,
            "target_shm_pct_of_memcpy": SHM_TARGET_PCT_OF_MEMCPY,
            "target_shm_read_pct_of_memcpy": SHM_READ_TARGET_PCT_OF_MEMCPY}


# ====================================================================== report
def format_relay(data: dict[str, Any]) -> str:
    memcpy = {m["size_bytes"]: m for m in data["memcpy"]}
    rows: list[list[Any]] = []
    for size, m in memcpy.items():
        rows.append([human_bytes(size), "memcpy (np.copyto, one process)", m["gbps"], m["best_gbps"], 100.0,
                     None, m["median_ms"], None, None, None, None, None])
        for r in (r for r in data["rows"] if r["size_bytes"] == size):
            p = r["phases_mean_ms"]
            rows.append([human_bytes(size), r["backend"], r["gbps"], r["best_gbps"], r["pct_of_memcpy"],
                         r["read_pct_of_memcpy"] if r["backend"] in ("shm", "shm one-off") else None,
                         r["median_ms"], r["mean_ms"], p.get("write"), p.get("send"), p.get("decode"), p.get("read")])
    table = format_table(
        ["size", "path", "GB/s", "best GB/s", "% memcpy", "read % memcpy", "median ms", "mean ms", "write_payload",
         "encode+send+zmq", "decode msg", "read_payload"],
        rows, digits=3, title="Relay throughput (sender write_payload -> ZMQ -> receiver read_payload, two processes)")
    paths = {r["backend"] for r in data["rows"]}
    notes = [("GB/s and % memcpy from the median transfer; 'read % memcpy' is the receiver's read_payload alone (its "
              "median) against memcpy, for the copying shm paths; the four phase columns are means in ms that add up "
              "to the mean. A copying transfer copies twice (into the slot, out of it), so its % memcpy stays under "
              "50.")]
    if paths & {"shm one-off", "shm zero-copy"}:
        notes.append(f"shm pool slot {human_bytes(data['pool_slot_bytes'])}; 'shm one-off' uses a "
                     f"{human_bytes(data['one_off_slot_bytes'])} pool, so each payload gets a segment of its own; "
                     "'shm zero-copy' is how stages read incoming chunks: in place, the slot freed when the data is "
                     "dropped.")
    if "mooncake raw" in paths:
        notes.append("'mooncake raw' is one Mooncake transfer_sync_read (tcp, loopback) of the same size between the "
                     "same two processes, timed around the call alone: the ceiling of the mooncake relay, which adds "
                     "the copy into its slot, the control message, a header check and the acknowledgement.")
    for r in (r for r in data["rows"] if r["backend"] in ("shm", "shm zero-copy") and r["size_bytes"] == max(memcpy)):
        verdict = "meets" if r["pct_of_memcpy"] >= data["target_shm_pct_of_memcpy"] else "MISSES"
        notes.append(f"{r['backend']} at {human_bytes(r['size_bytes'])}: {r['pct_of_memcpy']:.0f}% of memcpy "
                     f"({verdict} the {data['target_shm_pct_of_memcpy']:.0f}% target).")
        if r["backend"] == "shm":
            read_target = data["target_shm_read_pct_of_memcpy"]
            read_verdict = "meets" if r["read_pct_of_memcpy"] >= read_target else "MISSES"
            notes.append(f"shm copying receive (read_payload) at {human_bytes(r['size_bytes'])}: "
                         f"{r['read_pct_of_memcpy']:.0f}% of memcpy ({read_verdict} the {read_target:.0f}% target).")
    out = table + "\n" + "\n".join(notes)
    if data.get("mooncake_vs_raw"):
        target = data["target_mooncake_pct_of_raw"]
        ratio = format_table(
            ["size", "mooncake relay GB/s", "raw mooncake read GB/s", "relay / raw %"],
            [[human_bytes(c["size_bytes"]), c["relay_gbps"], c["raw_gbps"], c["pct_of_raw"]]
             for c in data["mooncake_vs_raw"]],
            digits=3, title="Mooncake relay end to end against raw Mooncake reads (median transfers)")
        last = max(data["mooncake_vs_raw"], key=lambda c: c["size_bytes"])
        verdict = "meets" if last["pct_of_raw"] >= target else "MISSES"
        out += (f"\n\n{ratio}\nmooncake relay at {human_bytes(last['size_bytes'])}: {last['pct_of_raw']:.0f}% of raw "
                f"({verdict} the {target:.0f}% target).")
    return out


# ====================================================================== CLI
def _size(text: str) -> int:
    units = {"B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    upper = text.strip().upper()
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if upper.endswith(unit):
            value = int(upper[: -len(unit)] or "0") * factor
            break
    else:
        value = int(upper)
    if value < 4096 or value % 4:
        raise argparse.ArgumentTypeError(f"a size must be at least 4096 bytes and a multiple of 4, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench relay", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", nargs="+", choices=list(BACKEND_PATHS), default=["mooncake", "shm", "inline"],
                        help="what to measure; mooncake also runs raw Mooncake reads and shm beside its relay")
    parser.add_argument("--sizes", nargs="+", type=_size, default=[1 << 20, 64 << 20],
                        help="payload sizes, e.g. 1MiB 64MiB (default)")
    parser.add_argument("--iterations", nargs="+", type=int, default=None,
                        help="transfers per size (default 100 for sizes under 16 MiB, else 20)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw figures to PATH")
    args = parser.parse_args(argv)
    iterations = args.iterations or [100 if s < 16 << 20 else 20 for s in args.sizes]
    if len(iterations) != len(args.sizes) or min(iterations) < 1:
        parser.error("--iterations: one count >= 1 per size")
    info = machine_info()
    print(f"omnipipe relay benchmark: {info['cpu_count']} cpus, load average "
          f"{' '.join(f'{x:.2f}' for x in info['load_avg_1_5_15'])}", flush=True)
    data = bench_relay_throughput(args.sizes, iterations, paths_for(args.backend))
    print(f"\n{format_relay(data)}", flush=True)
    if args.json:
        write_json(args.json, {"meta": {"machine": info, "backends": args.backend}, "relay": data})
        print(f"raw figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
