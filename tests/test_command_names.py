"""Messages name the command that was cut off: the vmrun operation, or the user's command,
never the wrapper's first word (`sh` for every host script)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vmrun.backends.hosts import records
from vmrun.config import load_settings
from vmrun.errors import ConnectionLostError
from vmrun.ssh.channel import Channels, command_line, describe


class _DeadChannel:
    """A session whose link is gone once the command started."""

    closed = True

    def exec_command(self, command: str) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        pass

    def recv_ready(self) -> bool:
        return False

    recv_stderr_ready = exit_status_ready = is_active = recv_ready

    def get_transport(self) -> _DeadChannel:
        return self

    def close(self) -> None:
        pass


class _LostHost(Channels):
    label = "h1"

    def __init__(self, tmp_path: Path) -> None:
        self.settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})

    @property
    def transport(self) -> Any:
        raise AssertionError("not used")

    def _lost_error(self, doing: str) -> ConnectionLostError:
        return ConnectionLostError(f"connection lost {doing}", host=self.label)

    def open_session(self) -> Any:
        return _DeadChannel()


def test_a_lost_run_operation_names_it_not_sh(tmp_path: Path) -> None:
    with pytest.raises(ConnectionLostError) as lost:
        records.stop(_LostHost(tmp_path), "r1")  # type: ignore[arg-type]
    assert lost.value.code == "connection-lost" and "stop of run r1" in lost.value.message
    assert "'sh'" not in lost.value.message


def test_a_lost_command_names_the_users_command_or_the_scripts_name(tmp_path: Path) -> None:
    host = _LostHost(tmp_path)
    argv = ("python", "train.py", "--epochs", "3")
    with pytest.raises(ConnectionLostError) as users:
        host.run(argv, what=command_line(argv))
    assert users.value.code == "connection-lost"
    assert "'python train.py --epochs 3'" in users.value.message
    with pytest.raises(ConnectionLostError) as script:
        host.run(["sh", "-c", "echo hi", "vmrun-x", "arg"])
    assert script.value.message.endswith("'vmrun-x'")
    assert describe(("true",)) == "'true'"
    assert describe(("sh", "-c", "x" * 100)).endswith("...'") and len(describe(("a" * 99,))) == 62
