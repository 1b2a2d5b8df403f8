"""The transfer engine against real sshd test hosts: incremental, verified, atomic, resumable.

Each test works in a folder of its own under the host user's home (the bed is shared by the
whole session). Files are written straight into the host's home and chowned to its user.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, wait_for
from testbed import NetnsBed, TestHost

from vmrun.errors import ConnectionLostError, HostKeyError, UsageError
from vmrun.ssh.connection import Connection
from vmrun.ssh.hosts import parse_host
from vmrun.transfer import streams
from vmrun.transfer.download import download
from vmrun.transfer.manifest import PART_SUFFIX, normalize_remote, parse_hashes, safe_rel
from vmrun.transfer.streams import ssh_command_for
from vmrun.transfer.types import FetchSpec, Options, Progress, Report
from vmrun.transfer.upload import upload

HOSTILE = [
    "with space",
    "quote'single",
    'quote"double',
    "-leading-dash",
    "new\nline",
    "back\\slash",
    "ünïcødé ✓",
    "glob*?[x]",
    "$(touch pwned)",
    "L" * 240,
]


def put(host: TestHost, rel: str, data: bytes, mtime: float | None = None) -> Path:
    """Write a file into the host user's home, owned by that user."""
    path = host.home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in [path.parent, *path.parent.parents]:
        if parent == host.home:
            break
        os.chown(parent, host.uid, host.gid)
    path.write_bytes(data)
    os.chown(path, host.uid, host.gid)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sessions(host: TestHost, since: int) -> tuple[int, int]:
    """(SSH logins, exec sessions) in the host's sshd log after offset `since`."""
    text = host.sshd_log()[since:]
    return text.count("Accepted publickey"), text.count("Starting session: command")


@pytest.fixture
def h1(bed: NetnsBed) -> TestHost:
    return bed["h1"]


@pytest.fixture
def remote_dir(h1: TestHost) -> Iterator[str]:
    name = f"xfer-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["rm", "-rf", str(h1.home / name)], check=False)


@pytest.fixture
def conn(bed_client: Client) -> Iterator[Connection]:
    with Connection(parse_host("h1"), bed_client.settings()) as c:
        yield c


def fetch(conn: Connection, remote: str, dest: Path, **opts: object) -> Report:
    spec = FetchSpec(normalize_remote(remote), remote)
    return download(conn, [spec], dest, Options(**opts))  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["openssh", "paramiko"])
def test_second_fetch_moves_nothing_and_a_new_file_alone_is_fetched(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path, engine: str
) -> None:
    files = {f"{remote_dir}/f{i:02d}.bin": os.urandom(1000 + i) for i in range(20)}
    files[f"{remote_dir}/sub/big.bin"] = os.urandom(5 << 20)  # over SMALL: spliced
    for rel, data in files.items():
        put(h1, rel, data)
    first = fetch(conn, remote_dir, tmp_path, engine=engine)
    assert first.engine == engine
    assert sorted(first.fetched) == sorted(files) and not first.failed
    for rel, data in files.items():
        local = tmp_path / rel
        assert local.read_bytes() == data
        assert local.stat().st_mtime_ns == (h1.home / rel).stat().st_mtime_ns

    offset = len(h1.sshd_log())
    second = fetch(conn, remote_dir, tmp_path, engine=engine)
    assert second.fetched == [] and second.wire_bytes == 0
    assert second.unchanged == len(files)
    assert sessions(h1, offset) == (0, 1)  # one listing round trip on the open connection

    put(h1, f"{remote_dir}/sub/new.txt", b"fresh")
    third = fetch(conn, remote_dir, tmp_path, engine=engine)
    assert third.fetched == [f"{remote_dir}/sub/new.txt"]
    assert third.wire_bytes == 5 and third.unchanged == len(files)
    assert not list(tmp_path.rglob(f"*{PART_SUFFIX}"))


def test_hostile_names_arrive_byte_for_byte(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    names = [*HOSTILE, "bytes-\udcff\udcfe"]  # not UTF-8 on the host: b"bytes-\xff\xfe"
    for i, name in enumerate(names):
        path = h1.home / remote_dir / "d" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"content {i}".encode())
    subprocess.run(["chown", "-R", f"{h1.uid}:{h1.gid}", str(h1.home / remote_dir)], check=True)
    report = fetch(conn, remote_dir, tmp_path)
    assert not report.failed and len(report.fetched) == len(names)
    for i, name in enumerate(names):
        assert (tmp_path / remote_dir / "d" / name).read_bytes() == f"content {i}".encode()
    assert not (h1.home / "pwned").exists() and not (tmp_path / "pwned").exists()
    assert fetch(conn, remote_dir, tmp_path).unchanged == len(names)


def test_symlinks_outside_the_directory_are_not_followed(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    put(h1, f"{remote_dir}-secret/key", b"outside")
    put(h1, f"{remote_dir}/real.txt", b"inside")
    tree = h1.home / remote_dir
    os.symlink("/etc/hostname", tree / "abs-link")
    os.symlink(f"../{remote_dir}-secret/key", tree / "rel-escape")
    os.symlink(f"../{remote_dir}-secret", tree / "dir-escape")
    os.symlink("real.txt", tree / "inside-link")
    report = fetch(conn, remote_dir, tmp_path)
    subprocess.run(["rm", "-rf", str(h1.home / f"{remote_dir}-secret")], check=True)
    local = tmp_path / remote_dir
    assert sorted(os.listdir(local)) == ["inside-link", "real.txt"]
    assert os.readlink(local / "inside-link") == "real.txt"
    assert len(report.skipped) == 3 and report.links == 1
    assert all("not followed" in s for s in report.skipped)
    assert not any("outside" in p.read_text() for p in local.iterdir())


def test_corrupted_local_copy_is_replaced_with_verify(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    data = os.urandom(300_000)
    put(h1, f"{remote_dir}/model.pt", data)
    fetch(conn, remote_dir, tmp_path)
    local = tmp_path / remote_dir / "model.pt"
    before = local.stat()
    local.write_bytes(bytes(b ^ 0xFF for b in data[:10]) + data[10:])  # same size
    os.utime(local, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime

    plain = fetch(conn, remote_dir, tmp_path)  # size+mtime say unchanged: not looked at
    assert plain.fetched == [] and local.read_bytes() != data
    checked = fetch(conn, remote_dir, tmp_path, verify=True)
    assert checked.replaced == 1 and checked.fetched == [f"{remote_dir}/model.pt"]
    assert local.read_bytes() == data
    assert fetch(conn, remote_dir, tmp_path, verify=True).checked == 1


def test_same_size_other_mtime_is_settled_by_checksum(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    path = put(h1, f"{remote_dir}/a.txt", b"same bytes", mtime=1_600_000_000)
    fetch(conn, remote_dir, tmp_path)
    os.utime(path, (1_700_000_000, 1_700_000_000))  # touched on the host, bytes unchanged
    report = fetch(conn, remote_dir, tmp_path)
    assert report.fetched == [] and report.checked == 1 and report.unchanged == 1
    assert (tmp_path / remote_dir / "a.txt").stat().st_mtime == 1_700_000_000
    put(h1, f"{remote_dir}/a.txt", b"diff bytes", mtime=1_800_000_000)  # same size
    assert fetch(conn, remote_dir, tmp_path).fetched == [f"{remote_dir}/a.txt"]
    assert (tmp_path / remote_dir / "a.txt").read_bytes() == b"diff bytes"


def test_killed_session_leaves_no_final_file_and_the_rerun_resumes(
    h1: TestHost, bed_client: Client, remote_dir: str, tmp_path: Path
) -> None:
    data = os.urandom(24 << 20)
    put(h1, f"{remote_dir}/snapshot.pt", data)
    final = tmp_path / remote_dir / "snapshot.pt"
    box: dict[str, BaseException] = {}

    def slow_fetch() -> None:
        with Connection(parse_host("h1"), bed_client.settings()) as c:
            try:
                fetch(c, remote_dir, tmp_path, bwlimit=6 << 20, engine="openssh")
            except BaseException as exc:
                box["error"] = exc

    worker = threading.Thread(target=slow_fetch)
    worker.start()

    def partial() -> Path | None:
        parts = list((tmp_path / remote_dir).glob(f".snapshot.pt.*{PART_SUFFIX}"))
        return parts[0] if parts and parts[0].stat().st_size >= 4 << 20 else None

    part = wait_for(partial, 30, "4 MiB to arrive")
    h1.stop_sshd()  # every process of the host dies: sshd, its sessions, tar
    worker.join(timeout=30)
    h1.start_sshd()
    assert isinstance(box.get("error"), ConnectionLostError), box
    assert not final.exists()
    assert isinstance(part, Path) and part.exists()
    arrived = part.stat().st_size
    assert 0 < arrived < len(data)

    with Connection(parse_host("h1"), bed_client.settings()) as c:
        report = fetch(c, remote_dir, tmp_path)
    assert report.resumed == 1 and report.wire_bytes == len(data) - arrived
    assert final.read_bytes() == data and not part.exists()


def test_a_file_that_changes_after_the_listing_is_fetched_again(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    path = put(h1, f"{remote_dir}/growing.log", os.urandom(6 << 20))
    grown = os.urandom(7 << 20)

    class RewriteOnce(Progress):
        """Rewrites the file between the listing and the transfer, the first time only."""

        calls = 0

        def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
            self.calls += 1
            if self.calls == 1:
                path.write_bytes(grown)

    spec = FetchSpec(normalize_remote(remote_dir), remote_dir)
    hook = RewriteOnce()
    report = download(conn, [spec], tmp_path, Options(), hook)
    assert hook.calls == 2  # the first attempt failed its checks; the second is fresh
    assert report.fetched == [f"{remote_dir}/growing.log"] and not report.failed
    assert (tmp_path / remote_dir / "growing.log").read_bytes() == grown


def test_a_file_that_keeps_changing_fails_with_a_clear_reason_and_no_final_file(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    path = put(h1, f"{remote_dir}/restless.bin", os.urandom(6 << 20))

    class RewriteEveryTime(Progress):
        """Rewrites the file between each listing and its transfer: it never settles."""

        calls = 0

        def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
            self.calls += 1
            path.write_bytes(os.urandom((6 + self.calls) << 20))

    spec = FetchSpec(normalize_remote(remote_dir), remote_dir)
    hook = RewriteEveryTime()
    report = download(conn, [spec], tmp_path, Options(), hook)
    assert hook.calls == 2  # sent once more from scratch, then reported
    assert list(report.failed) == [f"{remote_dir}/restless.bin"], report.failed
    why = report.failed[f"{remote_dir}/restless.bin"]
    assert why == "changed on the host during the transfer" or why.startswith("SHA-256 differs")
    assert not report.fetched and not (tmp_path / remote_dir / "restless.bin").exists()
    assert not [p for p in (tmp_path / remote_dir).iterdir() if p.name.endswith(".vmrun-part")]


def reader_positions(host: TestHost, path: Path) -> list[int]:
    """Where each of the host user's processes that has `path` open is reading it
    (/proc/PID/fdinfo `pos`): how far the host's tar has read the file."""
    found, target = [], os.path.realpath(path)
    for pid in host.user_pids():
        fds = Path(f"/proc/{pid}/fd")
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for fd in names:
            try:
                if os.readlink(fds / fd) != target:
                    continue
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            except OSError:
                continue
            found += [int(ln.split()[1]) for ln in info.splitlines() if ln.startswith("pos:")]
    return found


@pytest.mark.parametrize("engine", ["openssh", "paramiko"])
def test_a_checksum_mismatch_is_sent_once_more_then_fails_with_no_file_left(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path, engine: str
) -> None:
    """Same size, other bytes: the size checks pass and only the two SHA-256s disagree.

    A process on the host rewrites the file's last MiB while it is being sent, after the
    host has hashed it and before its tar has read that far: the bytes that arrive are
    not the bytes the host hashed. This happens in both attempts (the first and the one
    re-send), at moments the test makes sure of, not ones it hopes for.
    """
    mib = 64  # far more than every buffer between the host's tar and this process holds
    path = put(h1, f"{remote_dir}/snapshot.pt", os.urandom(mib << 20))
    final = tmp_path / remote_dir / "snapshot.pt"
    rewrite_tail = ["dd", "if=/dev/urandom", f"of={path}", "bs=1M", "count=1"]
    rewrite_tail += [f"seek={mib - 1}", "conv=notrunc", "status=none"]  # in place, same size
    tails_rewritten: list[int] = []  # where tar was reading when the tail was rewritten

    def host_hashing() -> bool:  # the engine's thread that asks the host for checksums
        return any(t.name == "vmrun-remote-hash" for t in threading.enumerate())

    class RewriteTailMidTransfer(Progress):
        """At the first bytes of each attempt: once the host has hashed the file, a host
        process rewrites its tail in place (same size, other bytes)."""

        def __init__(self) -> None:
            self.attempts = 0
            self.rewritten = 0

        def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
            self.attempts += 1

        def advance(self, host: str, nbytes: int) -> None:
            if self.rewritten == self.attempts:
                return
            self.rewritten = self.attempts
            wait_for(lambda: not host_hashing(), 30, "the host's checksums")
            h1.run(rewrite_tail, as_user=True)
            tails_rewritten.append(max(reader_positions(h1, path), default=-1))

    spec = FetchSpec(normalize_remote(remote_dir), remote_dir)
    hook = RewriteTailMidTransfer()
    report = download(conn, [spec], tmp_path, Options(engine=engine), hook)

    assert report.engine == engine
    assert hook.attempts == 2  # sent once more from scratch, then reported
    # tar was still reading the file, short of its tail, when the tail changed (each time)
    assert len(tails_rewritten) == 2, tails_rewritten
    assert all(0 <= pos < (mib - 1) << 20 for pos in tails_rewritten), tails_rewritten
    assert list(report.failed) == [f"{remote_dir}/snapshot.pt"], report.failed
    why = report.failed[f"{remote_dir}/snapshot.pt"]
    assert why.startswith("SHA-256 differs (host "), why
    assert not report.fetched and not final.exists()
    assert not [p for p in (tmp_path / remote_dir).iterdir() if p.name.endswith(PART_SUFFIX)]


def test_latest_include_and_exclude(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    for i in range(5):
        put(h1, f"{remote_dir}/snapshot_{i}.pt", b"s%d" % i, mtime=1_700_000_000 + i)
    put(h1, f"{remote_dir}/metrics.jsonl", b"{}")
    put(h1, f"{remote_dir}/notes.tmp", b"x")
    newest = FetchSpec(normalize_remote(remote_dir), "a", include=("*.pt",), latest=2)
    download(conn, [newest], tmp_path)
    assert sorted(os.listdir(tmp_path / "a")) == ["snapshot_3.pt", "snapshot_4.pt"]
    rest = FetchSpec(normalize_remote(remote_dir), "b", exclude=("*.pt", "*.tmp"))
    download(conn, [rest], tmp_path)
    assert os.listdir(tmp_path / "b") == ["metrics.jsonl"]


def test_a_missing_path_is_reported_and_the_rest_fetched(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    put(h1, f"{remote_dir}/there.txt", b"here")
    specs = [
        FetchSpec(f"{remote_dir}/nope", "x", label="nope"),
        FetchSpec(f"{remote_dir}/there.txt", "there.txt"),
    ]
    report = download(conn, specs, tmp_path)
    assert report.missing == ["nope"] and report.fetched == ["there.txt"]


def test_fetch_through_a_jump_host(bed: NetnsBed, bed_client: Client, tmp_path: Path) -> None:
    hidden = bed["hidden"]
    put(hidden, "jumped/file.bin", b"via bastion")
    with Connection(parse_host("hidden"), bed_client.settings()) as c:
        report = download(c, [FetchSpec("jumped", "j")], tmp_path, Options(engine="openssh"))
    assert report.engine == "openssh" and report.fetched == ["j/file.bin"]
    assert (tmp_path / "j" / "file.bin").read_bytes() == b"via bastion"


def test_auto_takes_openssh_through_a_jump_host_from_a_smaller_size(
    bed: NetnsBed, bed_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a jump host paramiko relays every byte in this process, so from
    RELAYED_TRANSFER bytes (lowered here to keep the test small) `auto` takes OpenSSH there,
    while a host reached directly keeps the open connection for the same size."""
    monkeypatch.setattr(streams, "RELAYED_TRANSFER", 1 << 20)
    data = os.urandom(2 << 20)
    engines = {}
    for name in ("hidden", "h1"):
        put(bed[name], "engine-pick/f.bin", data)
        with Connection(parse_host(name), bed_client.settings()) as c:
            report = download(c, [FetchSpec("engine-pick", name)], tmp_path)
        engines[name] = report.engine
        assert (tmp_path / name / "f.bin").read_bytes() == data
    assert engines == {"hidden": "openssh", "h1": "paramiko"}


def test_openssh_streams_get_the_same_strict_host_key_policy(
    bed: NetnsBed, bed_client: Client, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    argv = ssh_command_for(conn, "echo ok")
    text = " ".join(argv)
    assert "StrictHostKeyChecking=yes" in text and "BatchMode=yes" in text
    assert str(bed_client.settings().known_hosts) in text
    assert subprocess.run(argv, capture_output=True, text=True).stdout == "ok\n"

    known = bed_client.ssh_dir / "known_hosts"
    good = known.read_text()
    h1, h2 = bed["h1"], bed["h2"]
    try:
        # h1's address filed with h2's key: a changed key must be refused
        known.write_text("".join(f"{h1.addr} {k}\n" for k in h2.host_key_pub_lines))
        changed = subprocess.run(argv, capture_output=True, text=True)
        assert changed.returncode == 255 and changed.stdout == ""
        put(h1, f"{remote_dir}/a", b"a")  # the listing runs on the verified connection,
        with pytest.raises(HostKeyError):  # the bytes would need the ssh client: refused
            download(conn, [FetchSpec(remote_dir, "x")], tmp_path, Options(engine="openssh"))
        assert list((tmp_path / "x").iterdir()) == []  # no file, not even a partial one
        known.write_text("")  # unknown: refused without a prompt (BatchMode)
        unknown = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert unknown.returncode == 255 and "verification failed" in unknown.stderr
    finally:
        known.write_text(good)


def test_upload_is_incremental_verified_and_keeps_names(
    h1: TestHost, conn: Connection, remote_dir: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    for i, name in enumerate(HOSTILE):
        (src / "pkg").mkdir(parents=True, exist_ok=True)
        (src / "pkg" / name).write_bytes(b"u%d" % i)
    (src / "big.bin").write_bytes(os.urandom(3 << 20))
    first = upload(conn, src, remote_dir)
    assert len(first.fetched) == len(HOSTILE) + 1 and not first.failed
    for path in src.rglob("*"):
        if path.is_file():
            there = h1.home / remote_dir / path.relative_to(src)
            assert there.read_bytes() == path.read_bytes()
            assert there.stat().st_mtime_ns == path.stat().st_mtime_ns
    assert upload(conn, src, remote_dir).unchanged == len(HOSTILE) + 1
    (src / "pkg" / HOSTILE[0]).write_bytes(b"changed")
    again = upload(conn, src, remote_dir)
    assert again.fetched == [f"pkg/{HOSTILE[0]}"]
    assert not [p for p in (h1.home / remote_dir).rglob("*") if p.name.endswith(PART_SUFFIX)]


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> int:
    """Files from 4 MiB are cut into ranges when several streams run (64 MiB otherwise)."""
    from vmrun.transfer import download as download_module
    from vmrun.transfer import records

    for module in (streams, records, download_module):
        monkeypatch.setattr(module, "PARALLEL_BYTES", 4 << 20)
    return 4 << 20


@pytest.mark.parametrize("engine", ["openssh", "paramiko"])
def test_big_files_go_in_ranges_over_several_streams_both_ways(
    h1: TestHost,
    conn: Connection,
    remote_dir: str,
    tmp_path: Path,
    small_ranges: int,
    engine: str,
) -> None:
    big, other = os.urandom((13 << 20) + 5), os.urandom(small_ranges + 1)
    put(h1, f"{remote_dir}/down/big.bin", big)
    put(h1, f"{remote_dir}/down/other.bin", other)
    put(h1, f"{remote_dir}/down/small.txt", b"small")
    offset = len(h1.sshd_log())
    got = fetch(conn, f"{remote_dir}/down", tmp_path, streams=3, engine=engine)
    assert (got.streams, got.engine) == (3, engine) and not got.failed
    assert (tmp_path / remote_dir / "down" / "big.bin").read_bytes() == big
    assert (tmp_path / remote_dir / "down" / "other.bin").read_bytes() == other
    if engine == "openssh":
        assert sessions(h1, offset)[0] >= 3  # a connection of its own for each stream

    src = tmp_path / "up"
    src.mkdir()
    (src / "big.bin").write_bytes(big)
    (src / "small.txt").write_bytes(b"small")
    sent = upload(conn, src, f"{remote_dir}/up", Options(streams=3, engine=engine))
    assert sent.streams == 3 and sorted(sent.fetched) == ["big.bin", "small.txt"]
    there = h1.home / remote_dir / "up"
    assert (there / "big.bin").read_bytes() == big
    assert (there / "big.bin").stat().st_mtime_ns == (src / "big.bin").stat().st_mtime_ns
    assert not [p for p in there.iterdir() if p.name.endswith(PART_SUFFIX)]


def test_a_push_starts_its_streams_during_the_check_and_leaves_none_when_refused(
    h1: TestHost,
    conn: Connection,
    remote_dir: str,
    tmp_path: Path,
    small_ranges: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """push_host starts a big file's OpenSSH streams while its folder check is out: the file
    goes over them, none more is opened, and the first places it (no round trip after the
    data); a refused check leaves no stream and no folder behind."""
    from vmrun.transfer import push as push_module
    from vmrun.transfer import records

    monkeypatch.setenv("VMRUN_TRANSFER_STREAMS", "3")
    monkeypatch.setenv("VMRUN_TRANSFER_ENGINE", "openssh")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom((9 << 20) + 7))
    started: list[records.Opened] = []
    real_start = records.Opened.start.__func__  # type: ignore[attr-defined]

    sshs: list[list[streams.OpenSshStream]] = []  # each Opened's streams, as started

    def start(cls: type[records.Opened], *args: object) -> records.Opened:
        started.append(real_start(cls, *args))
        sshs.append(list(started[-1].streams))  # type: ignore[arg-type]
        return started[-1]

    monkeypatch.setattr(records.Opened, "start", classmethod(start))
    moved: list[object] = []
    monkeypatch.setattr(records, "_move", lambda conn, d, items: moved.extend(items))
    done = push_module.push_host(conn, [big], remote_dir)
    (report,) = done.reports
    assert report.streams == 3 and report.fetched == ["big.bin"] and not report.failed
    assert (h1.home / remote_dir / "big.bin").read_bytes() == big.read_bytes()
    assert len(started) == 1 and started[0].streams == [] and moved == []
    with pytest.raises(UsageError) as refused:
        push_module.push_host(conn, [big], "/proc/vmrun-push-refused")
    assert refused.value.code == "target-not-writable"
    assert len(started) == 2 and started[1].streams == [] and started[1].unused == []
    assert len(sshs[1]) == 3 and all(s.proc.poll() is not None for s in sshs[1])  # all ended


def test_a_cut_ranged_fetch_keeps_what_arrived_from_the_start_and_resumes(
    h1: TestHost, bed_client: Client, remote_dir: str, tmp_path: Path, small_ranges: int
) -> None:
    data = os.urandom(24 << 20)
    put(h1, f"{remote_dir}/model.pt", data)
    box: dict[str, BaseException] = {}

    def slow_fetch() -> None:
        with Connection(parse_host("h1"), bed_client.settings()) as c:
            try:
                fetch(c, remote_dir, tmp_path, bwlimit=6 << 20, streams=3)
            except BaseException as exc:
                box["error"] = exc

    worker = threading.Thread(target=slow_fetch)
    worker.start()

    def partial() -> Path | None:
        parts = list((tmp_path / remote_dir).glob(f".model.pt.*{PART_SUFFIX}"))
        return parts[0] if parts and parts[0].stat().st_blocks * 512 >= 10 << 20 else None

    part = wait_for(partial, 30, "10 MiB to arrive over the streams")
    h1.stop_sshd()
    worker.join(timeout=30)
    h1.start_sshd()
    assert isinstance(box.get("error"), ConnectionLostError), box
    assert isinstance(part, Path) and not (tmp_path / remote_dir / "model.pt").exists()
    kept = part.read_bytes()
    assert 0 < len(kept) < len(data) and kept == data[: len(kept)]  # a prefix, no hole

    with Connection(parse_host("h1"), bed_client.settings()) as c:
        report = fetch(c, remote_dir, tmp_path)
    assert report.resumed == 1 and report.wire_bytes == len(data) - len(kept)
    assert (tmp_path / remote_dir / "model.pt").read_bytes() == data


def test_paths_and_checksum_lines_are_parsed_safely() -> None:
    assert normalize_remote("results/r1/") == "results/r1"
    assert normalize_remote("~/a/b") == "a/b"
    assert normalize_remote("/abs/../etc") == "/etc"  # absolute: given explicitly
    assert normalize_remote("x/../y", base="results/r1") == "results/r1/y"
    for bad, base in (("../x", None), ("a/../../x", None), ("..", None), ("../r2/x", "results/r1")):
        with pytest.raises(UsageError) as info:
            normalize_remote(bad, base=base)
        assert info.value.code == "usage" and bad in info.value.message
    assert safe_rel("a/b") and not safe_rel("../a") and not safe_rel("/a") and not safe_rel("a//b")
    out = (
        b"\\"
        + b"a" * 64
        + b" *./d/new\\nline\n"  # escaped name: one line per file
        + b"b" * 64
        + b" *./d/plain\n"
    )
    assert parse_hashes(out, ["d/gone", "d/new\nline", "d/plain"]) == {
        "d/new\nline": "a" * 64,
        "d/plain": "b" * 64,
    }
