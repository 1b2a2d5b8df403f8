"""Project sync (vmrun.sync) against real sshd test hosts, with real rsync and real git.

The test hosts share this machine's filesystem, so /usr/bin/rsync is there for them too.
Each test syncs into a work directory of its own under the host user's home.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, user_commands, wait_for
from test_transfer import HOSTILE, put
from testbed import NetnsBed, TestHost

from vmrun.errors import ExitCode, HostKeyError, UnreachableError, UsageError, exit_code_for
from vmrun.remote_paths import remote_workdir
from vmrun.ssh.connection import Connection
from vmrun.ssh.hosts import parse_host
from vmrun.sync.files import large_files, project_files
from vmrun.sync.plan import SyncReport
from vmrun.sync.project import RSYNC_FILES, sync_project
from vmrun.sync.rsync import rsync_word
from vmrun.transfer.manifest import PART_SUFFIX
from vmrun.transfer.types import Progress

needs_rsync = pytest.mark.skipif(
    shutil.which("rsync") is None, reason="rsync is not installed here (CI installs it)"
)
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
ENGINES = [pytest.param("rsync", marks=needs_rsync), "vmrun", "auto"]


def write(root: Path, rel: str, data: bytes | str = b"", mtime_ns: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def git(root: Path, *args: str) -> None:
    env = {"HOME": str(root.parent), "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=env)


@pytest.fixture
def h1(bed: NetnsBed) -> TestHost:
    return bed["h1"]


@pytest.fixture
def workdir(bed: NetnsBed) -> Iterator[str]:
    name = f"vmrun/t-{uuid.uuid4().hex[:8]}"
    yield name
    for host in ("h1", "hidden"):
        subprocess.run(["rm", "-rf", str(bed[host].home / name)], check=False)


@pytest.fixture
def conn(bed_client: Client) -> Iterator[Connection]:
    with Connection(parse_host("h1"), bed_client.settings()) as c:
        yield c


def same_tree(project: Path, files: list[str], there: Path) -> None:
    """Every file arrived byte for byte with its mtime; symlinks as symlinks."""
    for rel in files:
        local, remote = project / rel, there / rel
        if local.is_symlink():
            assert os.readlink(remote) == os.readlink(local), rel
            continue
        assert remote.read_bytes() == local.read_bytes(), rel
        assert remote.stat().st_mtime_ns == local.stat().st_mtime_ns, rel


# -- what goes, and where --------------------------------------------------------------


def _sample(root: Path) -> None:
    for rel in (
        "train.py",
        "pkg/model.py",
        "pkg/__pycache__/model.cpython-311.pyc",
        "pkg/results/__init__.py",  # a package named results is code: not the default
        "results/run-1/final.pt",
        "checkpoints/c.txt",
        "weights.safetensors",
        "tiny.pt",
        "data/raw.csv",
        "logs/a.log",
        "logs/keep.log",
        ".venv/bin/python",
        "myenv/pyvenv.cfg",
        "myenv/lib/site.py",
        "node_modules/x/i.js",
        ".DS_Store",
        "notes/scratch.txt",
    ):
        write(root, rel, rel)
    write(root, ".gitignore", "data/\n*.log\n!keep.log\n")
    write(root, ".vmrunignore", "notes/\n!tiny.pt\n")


EXPECTED = [
    ".gitignore",
    ".vmrunignore",
    "logs/keep.log",
    "pkg/model.py",
    "pkg/results/__init__.py",
    "tiny.pt",
    "train.py",
]


def test_project_files_outside_git_honours_gitignore_vmrunignore_and_defaults(
    tmp_path: Path,
) -> None:
    _sample(tmp_path)
    assert project_files(tmp_path) == EXPECTED


@needs_git
def test_project_files_in_a_git_repo_is_gits_view_plus_the_same_filters(tmp_path: Path) -> None:
    _sample(tmp_path)
    write(tmp_path, "pkg/.gitignore", "generated_*\n")
    write(tmp_path, "pkg/generated_table.py", "x")
    write(tmp_path, "secret.env", "x")
    write(tmp_path, "gone.py", "x")
    git(tmp_path, "init", "-q")
    write(tmp_path, ".git/info/exclude", "secret.env\n")
    git(tmp_path, "add", "gone.py", "train.py")
    (tmp_path / "gone.py").unlink()  # tracked, deleted from the work tree: nothing to send
    assert project_files(tmp_path) == [
        *EXPECTED[:2],
        "logs/keep.log",
        "pkg/.gitignore",
        *EXPECTED[3:],
    ]
    # a project that is a folder inside a repository: paths are relative to the project (and
    # its results/ is now the root one, vmrun's)
    assert project_files(tmp_path / "pkg") == [".gitignore", "model.py"]


def test_remote_workdir_is_stable_and_distinct(tmp_path: Path) -> None:
    a, b = tmp_path / "one" / "My Project!", tmp_path / "two" / "My Project!"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    assert remote_workdir(a) == remote_workdir(a) == remote_workdir(a / "x" / "..")
    assert remote_workdir(a).startswith("vmrun/My-Project-")
    assert remote_workdir(a) != remote_workdir(b)
    assert len(remote_workdir(a).rsplit("-", 1)[1]) == 6


def test_large_files_are_listed_biggest_first(tmp_path: Path) -> None:
    write(tmp_path, "small.bin", b"x" * 10)
    with open(tmp_path / "big.bin", "wb") as fh:
        fh.truncate(3000)  # sparse: size without the bytes
    write(tmp_path, "mid.bin", b"x" * 2000)
    os.symlink("big.bin", tmp_path / "link")
    files = ["small.bin", "big.bin", "mid.bin", "link", "missing"]
    assert large_files(tmp_path, files, threshold=2000) == [("big.bin", 3000), ("mid.bin", 2000)]
    assert large_files(tmp_path, files) == []  # the default threshold is 100 MiB


# -- sync to a host --------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_sync_is_incremental_and_keeps_what_the_host_wrote(
    h1: TestHost, conn: Connection, workdir: str, tmp_path: Path, engine: str
) -> None:
    project = tmp_path / "proj"
    for i in range(30):
        write(project, f"pkg/m{i:02d}.py", f"# module {i}\n" * (i + 1))
    write(project, "run.sh", "#!/bin/sh\necho hi\n").chmod(0o755)
    os.symlink("pkg/m01.py", project / "alias.py")
    files = project_files(project)
    there = h1.home / workdir

    first = sync_project(conn, project, workdir, engine=engine)
    assert first.files == 32 and first.sent == 32 and first.unchanged == 0
    assert first.sent_bytes == sum((project / f).stat().st_size for f in files if f != "alias.py")
    assert first.engine == ("vmrun" if engine == "auto" else engine)
    same_tree(project, files, there)
    assert os.access(there / "run.sh", os.X_OK)

    put(h1, f"{workdir}/results/r1/final.pt", b"trained")  # outputs of a run
    put(h1, f"{workdir}/outputs/log.txt", b"log")
    second = sync_project(conn, project, workdir, engine=engine)
    assert (second.sent, second.sent_bytes, second.unchanged) == (0, 0, 32)

    # same size, mtime 1 us later: a change rsync's default whole-second check would miss
    path = project / "pkg" / "m05.py"
    before = path.stat().st_mtime_ns
    write(project, "pkg/m05.py", path.read_text().upper(), mtime_ns=before + 1000)
    third = sync_project(conn, project, workdir, engine=engine)
    assert (third.sent, third.unchanged) == (1, 31)
    assert (there / "pkg" / "m05.py").read_text() == path.read_text()
    assert (there / "results" / "r1" / "final.pt").read_bytes() == b"trained"
    assert (there / "outputs" / "log.txt").read_bytes() == b"log"
    same_tree(project, files, there)
    assert not [p for p in there.rglob("*") if p.name.endswith((PART_SUFFIX, ".vmrun-link"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_names_arrive(
    h1: TestHost, conn: Connection, workdir: str, tmp_path: Path, engine: str
) -> None:
    project = tmp_path / "proj"
    for i, name in enumerate(HOSTILE):
        write(project, f"d/{name}", f"content {i}")
    write(project, "-top", "dash at the root")
    files = project_files(project)
    assert len(files) == len(HOSTILE) + 1
    report = sync_project(conn, project, workdir, files=files, engine=engine)
    assert report.sent == len(files)
    same_tree(project, files, h1.home / workdir)
    assert not (h1.home / "pwned").exists() and not (tmp_path / "pwned").exists()
    assert sync_project(conn, project, workdir, files=files, engine=engine).sent == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_symlinks_inside_are_links_outside_are_skipped_with_a_warning(
    h1: TestHost, conn: Connection, workdir: str, tmp_path: Path, engine: str
) -> None:
    project = tmp_path / "proj"
    write(project, "data/real.txt", "inside")
    write(tmp_path, "secret.txt", "outside")
    os.symlink("data/real.txt", project / "inside")
    os.symlink("data", project / "dir-inside")
    os.symlink("../secret.txt", project / "escape")
    os.symlink(str(tmp_path / "secret.txt"), project / "absolute")
    files = project_files(project)
    assert files == ["absolute", "data/real.txt", "dir-inside", "escape", "inside"]
    report = sync_project(conn, project, workdir, engine=engine)
    there = h1.home / workdir
    assert sorted(os.listdir(there)) == ["data", "dir-inside", "inside"]
    assert os.readlink(there / "inside") == "data/real.txt"
    assert os.readlink(there / "dir-inside") == "data"
    assert len(report.warnings) == 2 and all("outside the project" in w for w in report.warnings)
    assert report.sent == 3


@needs_rsync
def test_rsync_goes_through_the_jump_host(
    bed: NetnsBed, bed_client: Client, workdir: str, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    write(project, "train.py", "print('via bastion')")
    offset = len(bed["hidden"].sshd_log())
    with Connection(parse_host("hidden"), bed_client.settings()) as c:
        report = sync_project(c, project, workdir, engine="rsync")
    assert report.engine == "rsync" and report.sent == 1
    assert (bed["hidden"].home / workdir / "train.py").read_text() == "print('via bastion')"
    assert bed["hidden"].sshd_log()[offset:].count("Accepted publickey") == 2  # vmrun + rsync


@needs_rsync
def test_rsync_refuses_an_unknown_host_key_and_sends_nothing(
    h1: TestHost, bed_client: Client, conn: Connection, workdir: str, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    write(project, "train.py", "x")
    conn.open()  # verified with the key known; then the key is forgotten
    known = bed_client.ssh_dir / "known_hosts"
    good = known.read_text()
    known.write_text("")
    try:
        with pytest.raises(HostKeyError, match="host key"):
            sync_project(conn, project, workdir, engine="rsync")
    finally:
        known.write_text(good)
    assert list((h1.home / workdir).iterdir()) == []  # made by the verified connection only


class Recorder(Progress):
    def __init__(self) -> None:
        self.begun: list[tuple[int, int]] = []
        self.moved = 0
        self.ended: list[str] = []

    def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
        self.begun.append((files, nbytes))

    def advance(self, host: str, nbytes: int) -> None:
        self.moved += nbytes

    def file_end(self, host: str, path: str, ok: bool) -> None:
        assert ok
        self.ended.append(path)


@pytest.mark.parametrize("engine", ENGINES)
def test_progress_is_reported(conn: Connection, workdir: str, tmp_path: Path, engine: str) -> None:
    project = tmp_path / "proj"
    write(project, "small.txt", "s")
    write(project, "big.bin", os.urandom(3 << 20))
    rec = Recorder()
    report = sync_project(conn, project, workdir, engine=engine, progress=rec)
    assert report.engine == ("vmrun" if engine == "auto" else engine)
    assert rec.begun == [(2, (3 << 20) + 1)]
    assert rec.moved == (3 << 20) + 1
    assert sorted(rec.ended) == ["big.bin", "small.txt"]


@needs_rsync
def test_auto_sends_many_changes_with_rsync_and_few_on_the_open_connection(
    h1: TestHost, conn: Connection, workdir: str, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    for i in range(RSYNC_FILES):
        write(project, f"d{i % 10}/f{i}", b"x")
    conn.open()
    logins = len(h1.sshd_log())
    first = sync_project(conn, project, workdir)
    assert (first.engine, first.sent) == ("rsync", RSYNC_FILES)
    assert h1.sshd_log()[logins:].count("Accepted publickey") == 1  # rsync's own ssh

    logins = len(h1.sshd_log())
    write(project, "d0/f0", b"y", mtime_ns=(project / "d0/f0").stat().st_mtime_ns + 1)
    second = sync_project(conn, project, workdir)
    third = sync_project(conn, project, workdir)
    assert (second.engine, second.sent, third.sent) == ("vmrun", 1, 0)
    assert h1.sshd_log()[logins:].count("Accepted publickey") == 0  # the open connection only
    assert (h1.home / workdir / "d0" / "f0").read_bytes() == b"y"


def test_auto_lists_the_work_directory_once_per_sync(
    h1: TestHost, conn: Connection, workdir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing that decides what differs is the one the upload compares with: one
    listing command on the connection per sync, not one for `auto` and one for the upload."""
    project = tmp_path / "proj"
    write(project, "a.py", "1")
    write(project, "b.py", "2")
    sync_project(conn, project, workdir)
    write(project, "a.py", "changed", mtime_ns=(project / "a.py").stat().st_mtime_ns + 1)
    commands: list[str] = []
    real = Connection.capture

    def counted(self: Connection, command: str, **kwargs: object) -> object:
        commands.append(command)
        return real(self, command, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Connection, "capture", counted)
    report = sync_project(conn, project, workdir)
    assert (report.engine, report.sent, report.unchanged) == ("vmrun", 1, 1)
    assert sum("/transfer_list.sh" in c for c in commands) == 1, commands
    assert (h1.home / workdir / "a.py").read_bytes() == b"changed"


@needs_rsync
def test_the_engine_can_be_forced_by_environment(
    conn: Connection, workdir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    write(project, "one.py", "x")  # one small file: auto would send it on the open connection
    monkeypatch.setenv("VMRUN_SYNC_ENGINE", "rsync")
    report: SyncReport = sync_project(conn, project, workdir)
    assert report.engine == "rsync" and report.sent == 1
    assert sync_project(conn, project, workdir, engine="vmrun").engine == "vmrun"  # explicit
    monkeypatch.setenv("VMRUN_SYNC_ENGINE", "scp")
    with pytest.raises(UsageError) as info:
        sync_project(conn, project, workdir)
    assert info.value.code == "usage" and "scp" in info.value.message


@needs_rsync
def test_ssh_words_survive_rsyncs_own_splitting_of_e(tmp_path: Path) -> None:
    """rsync splits -e itself (quotes, no backslashes): run it with a program that records
    the argv it was given, and compare with the words meant."""
    record = tmp_path / "argv"
    program = tmp_path / "show"
    program.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {record}\nexit 7\n')
    program.chmod(0o755)
    words = [str(program), "a b", "it's", 'say "hi"', "mix'\"'", "", "back\\slash", "tab\there"]
    rsh = " ".join(w for w in map(rsync_word, words) if w is not None)
    subprocess.run(["rsync", "-e", rsh, str(record.parent), "host:dst/"], capture_output=True)
    assert record.read_bytes().split(b"\0")[: len(words) - 1] == [w.encode() for w in words[1:]]


@needs_rsync
def test_rsync_failing_to_connect_is_exit_12_and_leaves_nothing(
    h1: TestHost, bed_client: Client, workdir: str, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    write(project, "train.py", "x")

    class HostGoesDown(Progress):
        def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
            h1.stop_sshd()  # after the work dir is made, before rsync connects

    try:
        with (
            Connection(parse_host("h1"), bed_client.settings()) as c,
            pytest.raises(UnreachableError, match="refused") as caught,
        ):
            sync_project(c, project, workdir, engine="rsync", progress=HostGoesDown())
    finally:
        h1.start_sshd()
    assert exit_code_for(caught.value) == ExitCode.UNREACHABLE == 12
    assert list((h1.home / workdir).iterdir()) == []


def _session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


@needs_rsync
def test_an_interrupted_rsync_leaves_no_process_here_or_there(
    h1: TestHost, conn: Connection, workdir: str, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    write(project, "a.bin", os.urandom(1 << 20))
    sessions: list[int] = []

    class CtrlC(Progress):
        def file_begin(self, host: str, path: str, size: int, offset: int) -> None:
            for entry in os.listdir("/proc"):  # rsync leads its own session: find its pid
                with_project = str(project).encode() + b"/\0"
                if entry.isdigit() and with_project in _cmdline(entry):
                    sessions.append(int(entry))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sync_project(conn, project, workdir, engine="rsync", progress=CtrlC())
    assert len(sessions) == 1 and sessions[0] != os.getpid()
    wait_for(lambda: _session_members(sessions[0]) == [], 5, "rsync and its ssh to stop")
    wait_for(
        lambda: not any("rsync" in c for c in user_commands(h1)), 10, "the host's rsync to exit"
    )


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
