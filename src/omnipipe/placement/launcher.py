"""Where a stage runs: a ``Launcher`` starts a stage's processes and returns a ``StageHandle`` to watch them.

A stage may be ``world_size`` rank processes behind one handle (tensor parallel); rank 0 is the one that holds
the control sockets. The handle answers for the group: it is alive while every rank runs, its exit code is the
first rank's that ended, and killing it kills every rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from omnipipe.stage.launch import StageLaunch


class StageHandle(ABC):
    """The engine's view of one launched stage (all its ranks)."""

    @property
    @abstractmethod
    def pids(self) -> list[int]:
        """Process ids, rank order, on the host where the processes run (what their heartbeats carry)."""

    @property
    def node(self) -> str | None:
        """Where the ranks run, in words (a Ray node id), for messages; None: on this host."""
        return None

    @property
    @abstractmethod
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when any rank exits (for ``loop.add_reader``)."""

    @abstractmethod
    def alive(self) -> bool:
        """True while every rank runs."""

    @abstractmethod
    def exit_code(self) -> int | None:
        """The exit code of the first rank found ended, or None while all run. Does not block."""

    @abstractmethod
    def ended_rank(self) -> int | None:
        """Which rank was first found ended (the one ``exit_code`` is of), or None while all run."""

    @abstractmethod
    def kill(self) -> None:
        """Kill every rank still running."""

    @abstractmethod
    def wait(self, timeout_s: float | None) -> int | None:
        """Wait until every rank has exited; return ``exit_code()``, or None if ``timeout_s`` passed first."""

    def connection_lost(self) -> None:  # noqa: B027 - an optional hook: a local handle sees its ends directly
        """A tcp connection to the engine's socket for this stage dropped (the stage's, or any peer's). A handle
        that cannot see its processes end directly and at once (they run on another host) checks whether they
        still run and, if not, makes its ``sentinel`` readable; one that can (a local pidfd) ignores it."""

    @abstractmethod
    def close(self) -> None:
        """Release the handle's own resources (file descriptors); the processes are not touched."""


class Launcher(ABC):
    name: str = ""
    quick: bool = True  # launch() returns at once (a fork + exec); False: it may wait (on a cluster scheduler)

    @abstractmethod
    def launch(self, launch: StageLaunch) -> StageHandle:
        """Start ``launch.world_size`` rank processes of the stage; return their handle."""
