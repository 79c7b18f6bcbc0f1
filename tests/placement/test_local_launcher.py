"""The local launcher's handle on real short subprocesses: alive, exit code, kill, wait, sentinel."""

from __future__ import annotations

import select
import sys

from omnipipe.placement import launcher_for
from omnipipe.placement.local import LocalLauncher
from omnipipe.stage.launch import StageLaunch


def launch_spec(world_size: int = 1) -> StageLaunch:
    return StageLaunch(
        run_id="t", stage="s", kind="ar", runner="x:Y", device="cpu", threads=1, max_num_seqs=1, options={},
        ctrl_address="ipc:///nowhere", out_address="ipc:///nowhere", abort_address="ipc:///nowhere",
        chunk_listen_address=None, chunk_links={}, out_relay="inline", out_inline_threshold_bytes=0,
        relay_options={}, world_size=world_size,
    )


def script(body: str) -> tuple[str, ...]:
    """A child that reads its launch spec from stdin, as a stage does, then runs ``body``."""
    return (sys.executable, "-c", f"import sys, time; sys.stdin.buffer.read(); {body}")


def sentinel_fires(fd: int, timeout_s: float) -> bool:
    return bool(select.select([fd], [], [], timeout_s)[0])


def test_the_registry_names_the_local_launcher() -> None:
    assert isinstance(launcher_for("local"), LocalLauncher)


def test_a_running_group_is_alive_until_killed() -> None:
    handle = LocalLauncher(script("time.sleep(30)")).launch(launch_spec(world_size=2))
    try:
        assert len(handle.pids) == 2 and handle.alive() and handle.exit_code() is None
        assert handle.wait(0.1) is None and not sentinel_fires(handle.sentinel, 0.1)
        handle.kill()
        assert handle.wait(5) == -9
        assert not handle.alive() and sentinel_fires(handle.sentinel, 1)
    finally:
        handle.kill()
        handle.close()


def test_an_exiting_rank_fires_the_sentinel_with_its_exit_code() -> None:
    handle = LocalLauncher(script("sys.exit(3)")).launch(launch_spec())
    try:
        assert sentinel_fires(handle.sentinel, 10)
        assert handle.wait(5) == 3 and handle.exit_code() == 3 and not handle.alive()
    finally:
        handle.close()


def test_each_rank_gets_its_own_rank_in_the_launch_spec() -> None:
    body = "from omnipipe.stage.launch import StageLaunch; sys.exit(10 + StageLaunch.decode(raw).rank)"
    command = (sys.executable, "-c", f"import sys; raw = sys.stdin.buffer.read(); {body}")
    handle = LocalLauncher(command).launch(launch_spec(world_size=2))
    try:
        handle.wait(10)
        assert [p.returncode for p in handle._processes] == [10, 11]
    finally:
        handle.close()
