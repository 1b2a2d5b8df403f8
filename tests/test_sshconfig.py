"""sshconfig: ~/.ssh/config lookups, and what they cost a connecting command's start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_match_exec_still_runs_its_command(tmp_path: Path) -> None:
    """invoke is loaded on first use only, and `Match exec` is what uses it (in a process
    of its own: invoke reads stdin, which pytest's capture refuses)."""
    config = tmp_path / "config"
    flag = tmp_path / "flag"
    config.write_text(
        f'Match exec "test -e {flag}"\n  HostName flagged.example\nHost *\n  Port 2222\n'
    )
    probe = (
        "import sys\nfrom pathlib import Path\nfrom vmrun.ssh.hosts import parse_host\n"
        "from vmrun.ssh.sshconfig import resolve\n"
        "t = resolve(parse_host('u@box'), Path(sys.argv[1]))\nprint(t.hostname, t.port)"
    )

    def lookup() -> str:
        return subprocess.run(
            [sys.executable, "-c", probe, str(config)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout.strip()

    assert lookup() == "box 2222"
    flag.touch()
    assert lookup() == "flagged.example 2222"


def test_connecting_code_does_not_import_invoke_up_front() -> None:
    probe = "import sys, vmrun.ssh.connection, paramiko; print('invoke.tasks' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    assert out.strip() == "False"
