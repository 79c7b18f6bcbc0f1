"""What ``omnipipe up`` does when one of its children ends: restart a worker with back-off, or give up on it.

Each child is a ``Supervised``: its command, its process and, while it is down, when to start it again. A child
with ``restart=False`` (the gateway) is vital: its exit is fatal, and ``check`` says so. A worker that exits is
started again with the same command after 1 s, 2 s, 4 s ... (at most ``max_delay_s``); past ``max_restarts``
restarts in a row it stays down and the others go on serving. A worker that has run ``stable_after_s`` since its
last restart counts as healthy again: its count and back-off start over. ``check`` is called from ``up``'s loop
(every 0.5 s) and never sleeps.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from omnipipe.util.process import kill_group


@dataclass
class Supervised:
    """One child of ``up``."""

    name: str
    command: list[str]
    restart: bool = True
    """False: the child is vital, its exit stops everything."""
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    """Restarts in a row (reset once it has run ``stable_after_s``)."""
    started_at: float = 0.0
    next_start_at: float | None = None
    """While it is down and will be started again: when."""
    given_up: bool = False
    """Down for good: it reached the restart limit."""
    awaiting_back: bool = False
    """Restarted, and not yet seen serving (``back``)."""


@dataclass
class Supervisor:
    """Starts ``children``, restarts the ones that may be restarted, and reports each event as one line."""

    children: list[Supervised]
    start: Callable[[list[str]], subprocess.Popen[bytes]]
    max_restarts: int = 5
    max_delay_s: float = 30.0
    stable_after_s: float = 600.0
    say: Callable[[str], None] = field(default=lambda line: print(f"omnipipe: {line}", file=sys.stderr))

    def start_all(self) -> None:
        for child in self.children:
            self._start(child, time.monotonic())

    def processes(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """Every child's latest process (running or not), to stop them all."""
        return [(c.name, c.process) for c in self.children if c.process is not None]

    def check(self, now: float | None = None) -> str | None:
        """Handle exits and due restarts; returns why everything must stop (a vital child ended, or no restartable
        child is left), else None."""
        now = time.monotonic() if now is None else now
        for child in self.children:
            if child.given_up or child.process is None:
                continue
            if child.next_start_at is not None:
                if now >= child.next_start_at:
                    kill_group(child.process.pid)  # what the dead one started and left behind (its stages)
                    self._start(child, now)
                continue
            code = child.process.poll()
            if code is None:
                if child.restarts and now - child.started_at >= self.stable_after_s:
                    child.restarts = 0
                continue
            if not child.restart:
                return f"{child.name} exited with code {code}; stopping everything"
            child.awaiting_back = False
            if child.restarts >= self.max_restarts:
                child.given_up = True
                kill_group(child.process.pid)
                self.say(f"{child.name} exited with code {code}; it stays down ({self.max_restarts} restart(s) in a "
                         f"row reached), the others go on serving")
                continue
            delay = min(self.max_delay_s, 2.0 ** child.restarts)
            child.restarts += 1
            child.next_start_at = now + delay
            self.say(f"{child.name} exited with code {code}; restarting in {delay:g} s "
                     f"(restart {child.restarts} of {self.max_restarts})")
        restartable = [c for c in self.children if c.restart]
        if restartable and all(c.given_up for c in restartable):
            return "no worker is left (each reached its restart limit); stopping everything"
        return None

    def awaiting_back(self) -> Sequence[Supervised]:
        """Restarted children that are running and not yet seen serving."""
        return [c for c in self.children if c.awaiting_back and c.next_start_at is None]

    def back(self, child: Supervised, how: str = "is back") -> None:
        child.awaiting_back = False
        self.say(f"{child.name} {how} (restart {child.restarts} of {self.max_restarts})")

    def _start(self, child: Supervised, now: float) -> None:
        child.awaiting_back = child.process is not None
        child.process = self.start(child.command)
        child.started_at, child.next_start_at = now, None
