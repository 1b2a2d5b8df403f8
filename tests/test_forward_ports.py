"""`vmrun forward [LOCAL:]PORT` before any connection: the ports as `ssh -L` and `kubectl
port-forward` take them, bad values and a busy LOCAL refused in one line (exit 2)."""

from __future__ import annotations

import pytest
from conftest import error_in

from vmrun.cli.main import run
from vmrun.errors import UsageError
from vmrun.ssh.forward import bind_free, parse_ports


@pytest.mark.parametrize(
    ("text", "ports"),
    [("8888", (None, 8888)), ("8888:8889", (8888, 8889)), (" 1:65535 ", (1, 65535))],
)
def test_port_or_local_colon_port(text: str, ports: tuple[int | None, int]) -> None:
    assert parse_ports(text) == ports


@pytest.mark.parametrize(
    "text", ["0", "65536", "8888:0", "70000:80", "x", "8888:", ":8888", "1:2:3", "-1", "8e3", ""]
)
def test_bad_ports_are_refused(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_ports(text)
    assert info.value.code == "usage" and repr(text) in info.value.message


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = run(["forward", *args, "-H", "someone@nowhere.invalid"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("ports", ["0", "8888:99999", "junk"])
def test_the_cli_refuses_bad_ports_in_one_line(
    capsys: pytest.CaptureFixture[str], ports: str
) -> None:
    code, said = error_in(_one_line_exit_2(capsys, ports))
    assert code == "usage" and ports in said


def test_a_busy_local_port_asked_for_is_refused_not_moved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """LOCAL:PORT names the port here: taken, it is an error (before any connecting: the
    host here does not exist), never another port as PORT alone gets."""
    with bind_free(0) as holder:
        busy = holder.getsockname()[1]
        code, said = error_in(_one_line_exit_2(capsys, f"{busy}:8888"))
        assert code == "port-busy" and f"local port {busy}" in said
        with pytest.raises(UsageError) as taken:
            bind_free(busy, search=1)
        assert taken.value.code == "port-busy" and str(busy) in taken.value.message
        moved = bind_free(busy)  # PORT alone: the next free one, as before
        assert moved.getsockname()[1] > busy
        moved.close()


def test_local_colon_port_and_local_port_together_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, said = error_in(_one_line_exit_2(capsys, "8888:8889", "--local-port", "7000"))
    assert code == "usage" and "--local-port" in said


def test_the_autostop_holder_hears_a_heartbeat_so_a_vanished_client_stops_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forward's waiting command (vmrun's work for the host's autostop) runs under the
    wrapper's heartbeat and is sent lines while the forward lasts: without them a client that
    vanished (no EOF ever comes) would keep the host up until sshd drops the dead link."""
    import shlex
    import threading

    from vmrun.ssh import forward

    class Chan:
        def __init__(self) -> None:
            self.command = ""
            self.beats = threading.Semaphore(0)

        def exec_command(self, command: str) -> None:
            self.command = command

        def sendall(self, data: bytes) -> None:
            pass

        def send(self, data: bytes) -> None:
            assert data == b"\n"
            self.beats.release()

    chan = Chan()

    class Conn:
        label = "h1"

        def ensure_lib(self) -> None:
            pass

        def open_session(self) -> Chan:
            return chan

    monkeypatch.setattr(forward, "HOLD_BEAT_S", 0.2)
    fwd = forward.Forward(Conn(), "127.0.0.1", 8888, local_port=0)  # type: ignore[arg-type]
    fwd._hold()
    try:
        words = shlex.split(chan.command)  # exec /bin/sh WRAPPER CWD BEAT ...
        assert words[2].endswith("/command_wrapper.sh") and words[4] == "1"  # whole seconds
        assert chan.beats.acquire(timeout=5) and chan.beats.acquire(timeout=5)
    finally:
        fwd._stop.set()
