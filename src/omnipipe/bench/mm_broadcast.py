"""What it costs to bring one 1280x720 image to every rank of a tensor-parallel stage (two ranks, gloo over
loopback TCP, one torch thread each): the wire forms side by side, then the stage broadcaster's three modes
(``stage/broadcast.py``) on a burst of requests — broadcast time against materialise time per request.

    python -m omnipipe.bench.mm_broadcast [--requests 16] [--reps 20] [--format jpeg|png] [--json FILE]

The image is synthetic but photo-like (smooth gradients with fine noise); its encoded size is printed, since the
raw path's advantage is the ratio of the encoded bytes to the decoded float32 pixels (about 11 MB).
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from omnipipe.bench.report import format_table, machine_info, median, write_json
from omnipipe.stage.broadcast import MODES, Broadcaster

WIDTH, HEIGHT = 1280, 720


def photo_like(image_format: str, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    base = np.stack([x / WIDTH * 255, y / HEIGHT * 255, (x + y) / (WIDTH + HEIGHT) * 255], axis=-1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=image_format.upper(), **({"quality": 90} if image_format == "jpeg"
                                                                       else {}))
    return out.getvalue()


def decode(raw: dict[str, Any]) -> dict[str, Any]:
    """The materialise measured here: encoded bytes to float32 [3, H, W] in [0, 1]."""
    from PIL import Image

    with Image.open(io.BytesIO(raw["image"])) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return {"pixels": torch.from_numpy(pixels).permute(2, 0, 1).contiguous()}


def timed(reps: int, step: Callable[[], Any]) -> list[float]:
    """Seconds per ``step`` on this rank, each started together with the other rank's (a barrier first)."""
    out = []
    for _ in range(reps):
        dist.barrier()
        started = time.perf_counter()
        step()
        out.append(time.perf_counter() - started)
    return out


def wire_forms(rank: int, raw: dict[str, Any], reps: int) -> dict[str, list[float]]:
    decoded = decode(raw)
    sizes = torch.tensor(decoded["pixels"].shape)

    def object_of(value: Any) -> Callable[[], Any]:
        return lambda: dist.broadcast_object_list([value if rank == 0 else None], group_src=0)

    def decoded_tensor() -> None:
        buffer = decoded["pixels"] if rank == 0 else torch.empty(*sizes.tolist(), dtype=torch.float32)
        dist.broadcast(buffer, group_src=0)

    def raw_tensor() -> None:  # what the broadcaster's RAW message does: header, then msgpack bytes
        if rank == 0:
            payload = msgspec.msgpack.encode(["request", raw])
            dist.broadcast(torch.tensor([2, len(payload)], dtype=torch.int64), group_src=0)
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), group_src=0)
        else:
            header = torch.empty(2, dtype=torch.int64)
            dist.broadcast(header, group_src=0)
            buffer = torch.empty(int(header[1]), dtype=torch.uint8)
            dist.broadcast(buffer, group_src=0)
            msgspec.msgpack.decode(memoryview(buffer.numpy()))

    return {
        "object: decoded float32 (pickled)": timed(reps, object_of({"request_id": "r", "inputs": decoded})),
        "object: raw dict (pickled)": timed(reps, object_of({"request_id": "r", "inputs": raw})),
        "tensor: decoded float32": timed(reps, decoded_tensor),
        "tensor: raw msgpack bytes": timed(reps, raw_tensor),
        "materialise (decode here)": timed(reps, lambda: decode(raw)),
    }


def burst(rank: int, mode: str, raws: list[dict[str, Any]]) -> dict[str, float]:
    """``len(raws)`` requests submitted back to back on rank 0, then taken in order on every rank."""
    group = dist.new_group(backend="gloo")
    broadcaster = Broadcaster(mode, rank, 2, group, decode)
    ids = [f"r{i}" for i in range(len(raws))]
    dist.barrier()
    started = time.perf_counter()
    if rank == 0:
        for request_id, raw in zip(ids, raws, strict=True):
            broadcaster.submit(request_id, raw)
        submit_s = time.perf_counter() - started
        for request_id in ids:
            broadcaster.take(request_id)
    else:
        submit_s = 0.0
    dist.broadcast_object_list(["all taken"], group_src=0)  # rank 0's prefill command, once for the burst
    if rank > 0:
        for request_id in ids:
            broadcaster.take(request_id, timeout_s=120)
    taken_s = time.perf_counter() - started
    stats = [broadcaster.stats(request_id) for request_id in ids]
    broadcaster.close()
    dist.destroy_process_group(group)
    return {"submit_ms": submit_s * 1e3, "all_taken_ms": taken_s * 1e3,
            "materialize_ms": median([s["materialize_s"] for s in stats]) * 1e3,
            "broadcast_ms": median([s["broadcast_s"] for s in stats]) * 1e3}


def rank_main(rank: int, port: int, args: argparse.Namespace, outbox: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    raws = [{"image": photo_like(args.format, seed)} for seed in range(args.requests)]
    wire = wire_forms(rank, raws[0], args.reps)
    modes = {mode: burst(rank, mode, raws) for mode in MODES}
    outbox.put((rank, {"wire": wire, "modes": modes, "encoded_bytes": len(raws[0]["image"])}))
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omnipipe.bench.mm_broadcast", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16, help="requests in each mode's burst")
    parser.add_argument("--reps", type=int, default=20, help="repetitions of each wire form")
    parser.add_argument("--format", choices=["jpeg", "png"], default="jpeg")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    ranks = [ctx.Process(target=rank_main, args=(rank, port, args, outbox)) for rank in range(2)]
    for process in ranks:
        process.start()
    results = dict(outbox.get(timeout=900) for _ in ranks)
    for process in ranks:
        process.join()
    encoded = results[0]["encoded_bytes"]
    print(f"one {WIDTH}x{HEIGHT} {args.format.upper()}: {encoded / 1e3:.0f} kB encoded, "
          f"{3 * WIDTH * HEIGHT * 4 / 1e6:.1f} MB as float32; medians of {args.reps}")
    print(format_table(["form", "rank 0 ms", "rank 1 ms"],
                       [[name, median(results[0]["wire"][name]) * 1e3, median(results[1]["wire"][name]) * 1e3]
                        for name in results[0]["wire"]], title="one image on the wire"))
    print()
    print(format_table(
        ["mode", "submit ms (rank 0, all)", "all taken ms r0", "all taken ms r1", "broadcast ms/req r0",
         "materialise ms/req r0", "broadcast ms/req r1", "materialise ms/req r1"],
        [[mode, results[0]["modes"][mode]["submit_ms"], results[0]["modes"][mode]["all_taken_ms"],
          results[1]["modes"][mode]["all_taken_ms"], results[0]["modes"][mode]["broadcast_ms"],
          results[0]["modes"][mode]["materialize_ms"], results[1]["modes"][mode]["broadcast_ms"],
          results[1]["modes"][mode]["materialize_ms"]] for mode in MODES],
        title=f"a burst of {args.requests} requests through the broadcaster"))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "args": vars(args), "ranks": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
