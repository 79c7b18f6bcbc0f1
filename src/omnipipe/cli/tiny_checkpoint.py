"""``omnipipe tiny-checkpoint FAMILY DIR``: a tiny random checkpoint of a model family, written offline, to run its
pipeline on a CPU without a download. The families that have one register its writer in ``models/registry.py``."""

from __future__ import annotations

import argparse
from pathlib import Path

from omnipipe.cli.errors import CLIError
from omnipipe.models.registry import TINY_CHECKPOINTS


def add_tiny_checkpoint(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tiny-checkpoint", help="write a tiny random checkpoint of a model family (offline), to run "
                       "its pipeline on a CPU without a download")
    t.add_argument("family", choices=sorted(TINY_CHECKPOINTS), help="the pipeline whose checkpoint to write")
    t.add_argument("directory", type=Path, help="where to write it (created)")
    t.add_argument("--seed", type=int, default=0, help="weights seed (the same seed writes the same weights)")
    t.add_argument("--force", action="store_true", help="write into a directory that already holds files")
    t.add_argument("--size", choices=("tiny", "released"), default="tiny", help="tiny: toy sizes (seconds on a "
                   "CPU); released: the published config's sizes, random weights in bfloat16 (tens of GB)")
    t.add_argument("--layers", type=int, default=None, help="with --size released: this many layers in every "
                   "decoder and encoder stack (a smaller file of the same widths)")


def run_tiny_checkpoint(args: argparse.Namespace) -> int:
    from omnipipe.util.dotted import resolve

    if args.directory.exists() and not args.directory.is_dir():
        raise CLIError(f"directory: {args.directory} exists and is not a directory")
    if args.directory.is_dir() and any(args.directory.iterdir()) and not args.force:
        raise CLIError(f"directory: {args.directory} is not empty (its config, tokenizer and weights would be "
                       "replaced): give an empty or new directory, or --force")
    writer = resolve(TINY_CHECKPOINTS[args.family])
    if args.layers is not None and (args.size != "released" or args.layers < 1):
        raise CLIError("--layers: a number >= 1, with --size released")
    if args.size == "released":
        path = writer(args.directory, seed=args.seed, size="released", layers=args.layers)
        print(f"wrote a random {args.family} checkpoint at the released sizes to {path}")
        return 0
    path = writer(args.directory, seed=args.seed)
    print(f"wrote a tiny random {args.family} checkpoint to {path}")
    print(f"run it: omnipipe generate --pipeline {args.family} --model {path} \"hello\" -o answer.wav")
    return 0
