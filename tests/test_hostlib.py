"""vmrun's host-side files installed in a host's home and run by path (vmrun.ssh.hostlib),
without a host (quick tier): the guard and the installer run here by sh against a temporary
HOME, through the same `Channels.capture` a connection uses. The netns side (a real host's
`ps`, the round trips of `status` and `logs`) is tests/test_hostlib_bed.py."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from vmrun import hostside
from vmrun.remote_paths import LIB_DIR
from vmrun.ssh import hostlib, quoting
from vmrun.ssh.channel import Channels, describe


class LocalChannels(Channels):
    """STAND-IN for a connection: each command string runs here under sh in `home`, and is
    recorded (guarded, install, or plain) with the names of the files an install sent."""

    label = "local"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.calls: list[str] = []
        self.sent: list[list[str]] = []

    @property
    def transport(self):  # type: ignore[override]
        raise AssertionError("no transport here")

    def _lost_error(self, doing: str):  # type: ignore[override]
        raise AssertionError(doing)

    def _capture(self, command: str, stdin: bytes, what: str) -> tuple[int, bytes, str]:
        if command == hostlib.install_command():
            import io
            import tarfile

            self.calls.append("install")
            with tarfile.open(fileobj=io.BytesIO(stdin)) as tar:
                self.sent.append(tar.getnames())
        else:
            guarded = command.startswith("exec /bin/sh -c ") and "vmrun-lib " in command
            self.calls.append("guarded" if guarded else "plain")
        done = subprocess.run(
            ["sh", "-c", command],
            input=stdin,
            capture_output=True,
            env={"HOME": str(self.home), "PATH": os.environ["PATH"]},
            cwd=self.home,
            timeout=30,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr.decode()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


def _run_list(conn: LocalChannels) -> tuple[int, bytes, str]:
    """A raw command that runs a host-side file by path (what `vmrun status` sends)."""
    argv = hostside.command("run_list.sh", ".vmrun/runs")
    return conn.capture(quoting.plain_command(argv, activity=False))


def test_the_first_command_installs_then_runs_and_a_second_connection_sends_nothing(
    home: Path,
) -> None:
    first = LocalChannels(home)
    status, out, err = _run_list(first)
    assert status == 0 and out.startswith(b"NOW "), err
    assert first.calls == ["guarded", "install", "plain"]
    assert sorted(first.sent[0]) == sorted([*hostside.names(), "MANIFEST"])
    _run_list(first)
    assert first.calls[3:] == ["plain"], "the connection remembers: no guard, no round trip"
    again = LocalChannels(home)
    assert _run_list(again)[0] == 0
    assert again.calls == ["guarded"] and again.sent == [], "installing again is a no-op"


def test_the_folder_and_its_files_are_the_users_alone_and_match_the_manifest(home: Path) -> None:
    LocalChannels(home).ensure_lib()
    lib = home / hostside.lib_dir()
    assert stat.S_IMODE(lib.stat().st_mode) == 0o700
    for name in [*hostside.names(), "MANIFEST"]:
        assert stat.S_IMODE((lib / name).stat().st_mode) == 0o600, name
    assert (lib / "run_marks.py").read_text() == hostside.source("run_marks.py")
    assert (lib / "MANIFEST").read_text() == hostside.manifest()
    assert not list(lib.glob(".install.*")), "the temporary folder is gone"


def test_a_corrupted_or_missing_file_is_found_by_its_hash_and_it_alone_is_sent(home: Path) -> None:
    LocalChannels(home).ensure_lib()
    lib = home / hostside.lib_dir()
    (lib / "run_list.sh").write_text("echo tampered\n")
    (lib / "run_log.sh").unlink()
    conn = LocalChannels(home)
    status, out, _err = _run_list(conn)
    assert status == 0 and out.startswith(b"NOW "), "the command ran the good copy"
    assert conn.calls == ["guarded", "install", "plain"]
    assert sorted(conn.sent[0]) == ["MANIFEST", "run_list.sh", "run_log.sh"]
    assert (lib / "run_list.sh").read_text() == hostside.source("run_list.sh")
    assert (lib / "run_log.sh").is_file()


def test_a_changed_manifest_sends_everything_again(home: Path) -> None:
    LocalChannels(home).ensure_lib()
    (home / hostside.lib_dir() / "MANIFEST").write_text("0" * 64 + "  run_list.sh\n")
    conn = LocalChannels(home)
    conn.ensure_lib()
    assert conn.calls == ["guarded", "install"]
    assert sorted(conn.sent[0]) == sorted([*hostside.names(), "MANIFEST"])


def test_a_changed_script_goes_to_a_new_folder_so_no_host_runs_a_stale_copy(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    LocalChannels(home).ensure_lib()
    old = hostside.lib_dir()
    text = hostside.source("run_list.sh") + "# edited\n"
    original = hostside.source
    for cached in (hostside.manifest, hostside.lib_dir):
        cached.cache_clear()
    edited = lambda n: text if n == "run_list.sh" else original(n)  # noqa: E731
    monkeypatch.setattr(hostside, "source", edited)
    monkeypatch.setattr(hostlib, "source", edited)
    try:
        new = hostside.lib_dir()
        assert new != old
        conn = LocalChannels(home)
        assert _run_list(conn)[0] == 0
        assert conn.calls == ["guarded", "install", "plain"]
        assert (home / new / "run_list.sh").read_text().endswith("# edited\n")
        assert (home / old / "run_list.sh").read_text() == original("run_list.sh")
    finally:
        monkeypatch.undo()
        for cached in (hostside.manifest, hostside.lib_dir):
            cached.cache_clear()


def test_a_failing_install_is_an_error_naming_the_host(home: Path) -> None:
    (home / ".vmrun").mkdir()
    (home / ".vmrun" / "lib").write_text("a file where the folder goes")
    with pytest.raises(Exception) as info:
        _run_list(LocalChannels(home))
    assert getattr(info.value, "code", "") == "remote-failed" and info.value.host == "local"  # type: ignore[attr-defined]


def test_a_host_path_is_absolute_whatever_the_cwd(home: Path) -> None:
    word = hostside.path("run_list.sh")
    assert quoting.quote(word) == f'"$HOME"/{hostside.lib_dir()}/run_list.sh'
    line = quoting.join(["printf", "%s", word])
    done = subprocess.run(
        ["sh", "-c", f"cd / && {line}"],
        env={"HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"{home}/{hostside.lib_dir()}/run_list.sh"


def test_commands_name_their_script_and_carry_no_source() -> None:
    argv = hostside.command("run_list.sh", ".vmrun/runs")
    assert argv[0] == "sh" and describe(tuple(argv)) == "'run_list'"
    probe = hostside.command("netprobe.py", "facts", python="/env/bin/python")
    assert probe[0] == "/env/bin/python" and probe[1].endswith("/netprobe.py")
    wrapped = quoting.remote_command(argv)
    assert len(wrapped) < 300 and "\n" not in wrapped, wrapped
    with pytest.raises(FileNotFoundError):
        hostside.path("no_such.sh")


def test_the_folder_is_the_version_and_a_hash_under_remote_paths_lib_dir() -> None:
    from vmrun import __version__

    folder = hostside.lib_dir()
    assert folder.startswith(f"{LIB_DIR}/{__version__}-")
    assert folder.rsplit("-", 1)[1] == hostside.manifest_hash()[:12]
    assert "lib_guard.sh" in hostside.names() and "__init__.py" not in hostside.names()


def test_a_first_command_with_stdin_is_checked_first_so_its_input_is_never_lost(
    home: Path,
) -> None:
    conn = LocalChannels(home)
    assert conn.capture("cat", stdin=b"every byte") == (0, b"every byte", "")
    assert conn.calls == ["guarded", "install", "plain"]


def test_what_runs_on_a_slurm_compute_node_travels_whole() -> None:
    """A compute node need not see the login node's home: the GPU watch step carries its
    script's text (as the batch script does, vmrun.backends.slurm.job), no path into vmrun's
    folder."""
    from vmrun.backends.slurm.gpus import JobNode, srun_argv

    watch = srun_argv(JobNode("7", "n1", "r1"), 2)
    assert hostside.source("gpus_watch.bash") in watch
    assert not any(isinstance(w, hostside.HostPath) for w in watch)
