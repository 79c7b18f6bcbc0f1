"""The ``omnipipe`` command: its parser and the dispatch to each command's module.

    omnipipe generate "What is the capital of France?" --output answer.wav [--stats]
    omnipipe serve --pipeline default --port 8091
    omnipipe worker --pipeline default --port 22400 --capacity 2
    omnipipe models | download | tiny-checkpoint | bench engine | bench relay | bench quality
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from omnipipe.cli import gateway as gateway_cli
from omnipipe.cli.bench import add_bench, run_bench
from omnipipe.cli.errors import CLIError
from omnipipe.cli.generate import add_generate, run_generate
from omnipipe.cli.models import add_download, add_models, run_download, run_models
from omnipipe.cli.serve import add_serve, add_worker, run_serve, run_worker
from omnipipe.cli.tiny_checkpoint import add_tiny_checkpoint, run_tiny_checkpoint
from omnipipe.models.registry import UnknownPipelineError

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, PermissionError)

# command -> what runs it (the subparsers are added in this order)
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[[argparse.Namespace], int]]] = {
    "generate": (add_generate, run_generate),
    "serve": (add_serve, run_serve),
    "worker": (add_worker, run_worker),
    "gateway": (gateway_cli.add_gateway, gateway_cli.run_gateway),
    "up": (gateway_cli.add_up, gateway_cli.run_up),
    "sessions": (gateway_cli.add_sessions, gateway_cli.run_sessions),
    "models": (add_models, run_models),
    "tiny-checkpoint": (add_tiny_checkpoint, run_tiny_checkpoint),
    "download": (add_download, run_download),
    "bench": (add_bench, run_bench),
}


def _user_errors() -> tuple[type[BaseException], ...]:
    from omnipipe.api.async_omni import RequestFailedError
    from omnipipe.engine.startup import EngineStartError
    from omnipipe.models.preparation import ModelPreparationError

    return (*USER_ERRORS, CLIError, gateway_cli.GatewayCLIError, UnknownPipelineError, RequestFailedError,
            EngineStartError, ModelPreparationError)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default in --help (when it has one worth showing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text and action.option_strings
                and action.nargs != 0):
            text += " (default: %(default)s)" if text else "default: %(default)s"
        return text


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: defaults shown in --help; a mistake is reported with that command's usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and self.prog != "omnipipe":  # a subcommand: its own usage, not the top level's
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def build_parser() -> argparse.ArgumentParser:
    from omnipipe import __version__

    parser = _Parser(prog="omnipipe", description="Serve multi-stage omni-modal models.")
    parser.add_argument("--version", action="version", version=f"omnipipe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    _, run = COMMANDS[args.command]
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\nomnipipe: interrupted", file=sys.stderr)
        return 130
    except _user_errors() as exc:
        print(f"omnipipe: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
