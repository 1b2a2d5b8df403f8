"""quoting: every argv word must reach a real POSIX shell byte for byte."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess

import pytest

from vmrun.ssh.quoting import check_env_name, env_header, join, quote, remote_command

HOSTILE = [
    "plain",
    "with space",
    "$HOME",
    "${PATH}",
    "`id`",
    "$(id)",
    "a;b",
    "a && b",
    "a|b",
    "new\nline",
    "tab\there",
    "-n",
    "--flag=value",
    "-",
    "ünïcødé ✓",
    "'single'",
    '"double"',
    "back\\slash",
    "",
    "*",
    "~",
    "!bang",
    "#hash",
    "a'b\"c",
    "trailing\n",
    "\r\x1b[31mansi",
]

SHELLS = [s for s in ("sh", "bash", "dash") if shutil.which(s)]


def _echo_argv(shell: str, words: list[str]) -> list[str]:
    script = 'for a in "$@"; do printf "%s\\0" "$a"; done'
    line = join(["sh", "-c", script, "argv0", *words])
    out = subprocess.run([shell, "-c", line], capture_output=True, check=True).stdout
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


@pytest.mark.parametrize("shell", SHELLS)
def test_hostile_words_arrive_byte_for_byte(shell: str) -> None:
    assert _echo_argv(shell, HOSTILE) == HOSTILE


def test_random_words_round_trip() -> None:
    rng = random.Random(1234)
    alphabet = "ab $`'\"\\;|&<>(){}[]*?~!#\n\t-=%ü✓"
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    assert _echo_argv("sh", words) == words


def test_safe_words_stay_readable() -> None:
    assert quote("torchrun") == "torchrun"
    assert quote("--nproc-per-node=2") == "--nproc-per-node=2"
    assert quote("a b") == "'a b'"
    assert quote("") == "''"
    assert quote("it's") == "'it'\"'\"'s'"


def test_nul_and_non_str_are_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        quote("a\x00b")
    with pytest.raises(TypeError):
        quote(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        join([])


def test_env_names_are_checked() -> None:
    assert check_env_name("NCCL_DEBUG") == "NCCL_DEBUG"
    for bad in ("1X", "A-B", "A B", "", "A=B"):
        with pytest.raises(ValueError, match="invalid environment variable name"):
            check_env_name(bad)


@pytest.fixture(autouse=True)
def _host_home(host_home, monkeypatch) -> None:
    """The wrapper runs from vmrun's host-side files in a home of their own (HOME here)."""
    monkeypatch.setenv("HOME", str(host_home))


def _run_wrapped(
    argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run remote_command's text in a local sh, holding stdin open as an SSH channel does
    (activity=False here and below: no autostop marker in this machine's own home; the markers
    are tests/test_autostop_activity.py's)."""
    proc = subprocess.Popen(
        ["sh", "-c", remote_command(argv, cwd=cwd, activity=False)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(env_header(env))
    proc.stdin.flush()
    out = proc.stdout.read()
    err = proc.stderr.read()
    code = proc.wait(timeout=30)
    proc.stdin.close()
    return subprocess.CompletedProcess(argv, code, out, err)


def test_env_values_arrive_through_stdin_not_argv(tmp_path) -> None:
    secret = "s3cr3t with space, 'quote', $dollar and\nnewline\n"
    done = _run_wrapped(
        ["sh", "-c", 'printf "%s" "$TOKEN"; printf "|%s" "$(pwd)"'],
        env={"TOKEN": secret, "EMPTY": ""},
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"{secret}|{tmp_path}"
    # the secret is in no command line: not in the text handed to the login shell
    assert "s3cr3t" not in remote_command(["sh", "-c", "true"])


def test_wrapper_keeps_exit_status_and_reports_bad_cwd(tmp_path) -> None:
    assert _run_wrapped(["sh", "-c", "exit 7"]).returncode == 7
    done = _run_wrapped(["true"], cwd=str(tmp_path / "missing"))
    assert done.returncode == 126
    assert b"missing" in done.stderr


def test_wrapper_kills_process_group_when_stdin_closes() -> None:
    """EOF on the channel means the client is gone: the whole command tree must die."""
    proc = subprocess.Popen(
        ["sh", "-c", remote_command(["sh", "-c", "sleep 300 & echo $!; wait"], activity=False)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(env_header(None))
    proc.stdin.flush()
    grandchild = int(proc.stdout.readline())
    assert _alive(grandchild)
    proc.stdin.close()  # the "client" goes away
    assert proc.wait(timeout=10) == 128 + 15
    _wait_dead(grandchild, 10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pid: int, seconds: float) -> None:
    import time

    deadline = time.monotonic() + seconds
    while _alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.05)


@pytest.mark.netns  # a long-running real process: 9 s of beats and silence, not quick-tier
def test_heartbeat_wrapper_kills_the_group_when_the_client_falls_silent() -> None:
    """A link cut sends no EOF: with a heartbeat, silence alone ends the command."""
    import time

    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            remote_command(["sh", "-c", "sleep 300 & echo $!; wait"], heartbeat=3, activity=False),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    grandchild = None
    try:
        proc.stdin.write(env_header(None))
        proc.stdin.flush()
        grandchild = int(proc.stdout.readline())
        # a beat every 0.2 s against a 3 s heartbeat: only a 2.8 s stall of this process
        # could make the wrapper see silence while the test still beats
        beating_until = time.monotonic() + 2 * 3
        while time.monotonic() < beating_until:  # twice the heartbeat, still beating
            proc.stdin.write(b"\n")
            proc.stdin.flush()
            time.sleep(0.2)
            assert proc.poll() is None and _alive(grandchild)
        silent = time.monotonic()  # stdin stays open, as during a cut link
        assert proc.wait(timeout=30) == 128 + 15
        # the 3 s heartbeat decides; without it the command would run its 300 s. 3 + 10 s:
        # room for a loaded 2-core machine
        assert time.monotonic() - silent < 3 + 10
        _wait_dead(grandchild, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        if grandchild is not None and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
