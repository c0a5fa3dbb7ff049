"""The command line as the tests run it, and what a refusal looks like: exit 2, no traceback, the last line of
stderr one ``autoprec: error:`` line. ``run`` calls it in this process (:func:`searching.main`, as the command
does, which keeps a probe fast); ``autoprec`` runs it as a user does, in a process of its own with its own working
directory, TMPDIR and cache."""

import os
import subprocess
import sys
from pathlib import Path

from searching import main


def autoprec(*args, cwd: Path, tmp: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    tmp = tmp or cwd.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "AUTOPREC_CACHE": str(cwd.parent / "cache")}
    return subprocess.run([sys.executable, "-m", "autoprec.app.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_cli(*args, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The command line in a process of its own, in this environment (searches not about the final timing pass
    SHORTEST_FINAL_TIMING)."""
    return subprocess.run([sys.executable, "-m", "autoprec.app.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, *phrases: str) -> str:
    """The failure's last stderr line: ``autoprec: error: ...`` holding ``phrases``; exit 2; no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: "), proc.stderr[-3000:]
    for phrase in phrases:
        assert phrase in last, last
    return last


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def exit_code(argv) -> int:
    """main()'s status, each argument as text; argparse's own refusals exit through SystemExit(2)."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own refusal (exit 2, usage line)
        return exc.code


def run(argv, capsys) -> tuple[int, str]:
    """main()'s status and what it wrote to stderr."""
    code = exit_code(argv)
    return code, capsys.readouterr().err


def clean(code: int, err: str, allowed=(0, 2)) -> None:
    assert "Traceback" not in err, err[-3000:]
    assert code in allowed, (code, err[-3000:])
    if code == 2:
        last = err.strip().splitlines()[-1]
        assert last.startswith(("autoprec: error: ", "usage:")) or "error:" in last, err[-3000:]


def refused(argv, capsys, *phrases: str) -> str:
    """The command's last line when it exits 2 with one ``autoprec: error:`` line holding ``phrases``."""
    code, err = run(argv, capsys)
    assert "Traceback" not in err, err[-3000:]
    assert code == 2, (code, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: "), err[-3000:]
    for phrase in phrases:
        assert phrase in last, last
    return last
