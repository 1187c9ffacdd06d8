"""``python -m asynccoord``: usage errors exit 2 and touch no database."""

from __future__ import annotations

from pathlib import Path

import pytest

from asynccoord.cli import main


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--send", "no_such_module_here:send"], "'no_such_module_here'"),
        (["--send", "json"], "'json'"),
        (["--send", "os:path"], "'os:path' is not callable"),
        (["--send", "json:dumps", "--lock-key", "json:no_such_attr"], "'no_such_attr'"),
        (["--send", "json:dumps", "--nodes", "0"], "--nodes must be >= 1, got 0"),
        (["--send", "json:dumps", "--lease-s", "-1"], "lease_s must be > 0, got -1.0"),
        (["--send", "json:dumps", "--max-in-flight", "0"], "max_in_flight"),
        (["--send", "json:dumps", "--shutdown-timeout-s", "nan"], "--shutdown-timeout-s"),
    ],
)
def test_run_usage_errors_exit_2_and_create_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(db), *extra])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m asynccoord run"), err
    assert named in err
    assert list(tmp_path.iterdir()) == []  # nothing was opened or created


def test_run_missing_required_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(tmp_path / "x.db")])
    assert exited.value.code == 2
    assert "--send" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
