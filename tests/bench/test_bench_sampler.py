"""``omnipipe bench sampler`` prints its table (the device step beside the sort-based one, per batch and setting)
and refuses bad flags by name."""

from __future__ import annotations

import pytest

from omnipipe.bench import sampler


def test_the_table_has_a_row_per_batch_and_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert sampler.main(["--vocab", "500", "--batches", "1,3", "--repeats", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert [cell.strip() for cell in lines[0].split("|")[1:-1]] == sampler.HEADERS
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[2:]]
    assert [(row[0], row[1]) for row in rows] == [(b, s) for b in ("1", "3") for s in sampler.SETTINGS]
    assert all(float(row[2]) >= 0 and float(row[3]) >= 0 for row in rows)


@pytest.mark.parametrize(("flags", "named"), [(["--batches", "0"], "--batches"), (["--batches", "x"], "--batches"),
                                              (["--vocab", "10"], "--vocab"), (["--device", "nowhere"], "--device")])
def test_bad_flags_are_refused_by_name(flags: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        sampler.main(flags)
    assert stopped.value.code == 2 and named in capsys.readouterr().err
