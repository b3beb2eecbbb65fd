"""``dssync`` run by ``dssync.cli.main`` in the test's own process, for refusals: they must
come before any rank or file exists, and a subprocess would pay a Python and torch start-up
for each (the shell's view of the same one line is ``tests/test_cli.py``'s)."""

from types import SimpleNamespace

import pytest

from dssync import cli


def run_main(argv: list, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """``dssync argv`` in process, reported as ``subprocess.run`` would: ``returncode``,
    ``stdout``, ``stderr``."""
    monkeypatch.setattr(cli, "raise_on_sigterm", lambda: None)  # pytest keeps its own SIGTERM
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)
