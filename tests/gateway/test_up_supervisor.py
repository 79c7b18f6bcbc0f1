"""``omnipipe up``'s supervisor on its own: back-off, the restart limit, a vital gateway (fake processes, a fake
clock)."""

from __future__ import annotations

from typing import Any

from omnipipe.cli.supervisor import Supervised, Supervisor


class FakeProcess:
    """What the supervisor uses of a ``Popen``: ``pid`` and ``poll``; ``code`` set means it has exited."""

    count = 0

    def __init__(self) -> None:
        FakeProcess.count += 1
        self.pid = 10**7 + FakeProcess.count  # above Linux's pid limit: kill_group finds no such group
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


def make(max_restarts: int = 2, workers: int = 1) -> tuple[Supervisor, list[str]]:
    said: list[str] = []
    children = [*(Supervised(f"worker {22400 + i}", ["w"]) for i in range(workers)),
                Supervised("gateway", ["g"], restart=False)]
    supervisor = Supervisor(children, start=lambda command: FakeProcess(),  # type: ignore[arg-type, return-value]
                            max_restarts=max_restarts, stable_after_s=600, say=said.append)
    supervisor.start_all()
    return supervisor, said


def crash(supervisor: Supervisor, name: str, code: int = -9) -> Any:
    child = next(c for c in supervisor.children if c.name == name)
    child.process.code = code  # type: ignore[union-attr]
    return child


def test_a_dead_worker_is_restarted_with_back_off_then_stays_down() -> None:
    supervisor, said = make(max_restarts=2, workers=2)
    worker = crash(supervisor, "worker 22401")
    first = worker.process
    assert supervisor.check(now=100.0) is None
    assert said == ["worker 22401 exited with code -9; restarting in 1 s (restart 1 of 2)"]
    assert supervisor.check(now=100.5) is None and worker.process is first  # not yet
    assert supervisor.check(now=101.0) is None and worker.process is not first
    assert supervisor.awaiting_back() == [worker]
    supervisor.back(worker)
    assert said[-1] == "worker 22401 is back (restart 1 of 2)" and supervisor.awaiting_back() == []
    crash(supervisor, "worker 22401")
    supervisor.check(now=102.0)
    assert said[-1] == "worker 22401 exited with code -9; restarting in 2 s (restart 2 of 2)"
    supervisor.check(now=104.0)
    crash(supervisor, "worker 22401", code=1)
    assert supervisor.check(now=105.0) is None  # the other worker still serves
    assert said[-1].startswith("worker 22401 exited with code 1; it stays down")
    assert worker.given_up and supervisor.check(now=200.0) is None
    crash(supervisor, "worker 22400")
    supervisor.check(now=201.0)
    supervisor.check(now=202.0)
    crash(supervisor, "worker 22400")
    supervisor.check(now=203.0)
    supervisor.check(now=205.0)
    crash(supervisor, "worker 22400")
    assert "no worker is left" in (supervisor.check(now=206.0) or "")


def test_back_off_doubles_up_to_its_cap_and_starts_over_once_stable() -> None:
    supervisor, said = make(max_restarts=10)
    now = 0.0
    for _ in range(7):
        crash(supervisor, "worker 22400")
        supervisor.check(now=now)
        now += 60.0
        supervisor.check(now=now)
    assert [line.split("restarting in ")[1].split(" s")[0] for line in said] == ["1", "2", "4", "8", "16", "30", "30"]
    supervisor.check(now=now + 600)  # up 10 minutes: healthy again
    crash(supervisor, "worker 22400")
    supervisor.check(now=now + 601)
    assert said[-1] == "worker 22400 exited with code -9; restarting in 1 s (restart 1 of 10)"


def test_the_gateway_exiting_is_fatal() -> None:
    supervisor, said = make()
    crash(supervisor, "gateway", code=1)
    assert supervisor.check(now=1.0) == "gateway exited with code 1; stopping everything" and said == []
