"""Step scripts run without the host's rc files: bash started under sshd (SSH_CLIENT set)
sources ~/.bashrc, and Debian's bash /etc/bash.bashrc, even for `bash -c`; under vmrun's
`-u` a line such as Debian's `[ -z "$PS1" ] && return` failed with "PS1: unbound variable"
at the start of every step and every error excerpt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, error_in
from test_cli_setup import _last_run, _wipe
from testbed import NetnsBed, TestHost

# the line Debian's /etc/bash.bashrc starts with, and one more unset variable to be sure
BASHRC = '[ -z "$PS1" ] && return\necho "rc ran: $VMRUN_TEST_NEVER_SET"\n'

BOOK = """
name: rc
steps:
  - name: checked
    check: test -e "$HOME/never-there"
    apply: echo applied
  - name: failing
    apply: |
      echo "about to fail"
      exit 3
"""


@pytest.fixture
def h2(bed: NetnsBed) -> Iterator[TestHost]:
    host = bed["h2"]
    _wipe(host)
    rc = host.home / ".bashrc"
    rc.write_text(BASHRC)
    yield host
    rc.unlink(missing_ok=True)
    _wipe(host)


def test_no_rc_file_runs_under_step_scripts(
    bed_client: Client, h2: TestHost, tmp_path: Path
) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(BOOK)
    done = bed_client.vmrun("setup", "h2", "--playbook", str(book))
    assert done.returncode == 1, done.stderr + done.stdout
    code, said = error_in(done.stderr)
    assert code == "setup-step-failed" and said.startswith("h2: step failing"), done.stderr
    assert "exited 3" in said and "about to fail" in said, said  # its status, its last line
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h2.log")
    assert "applied" in log  # the check ran (and failed) in the same kind of shell
    for text in (done.stdout, done.stderr, log):
        assert "unbound variable" not in text, text
        assert "rc ran" not in text, text
