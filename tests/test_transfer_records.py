"""Uploads as records (vmrun.transfer.records, hostside/transfer_recv.py), driven locally: the
host's receiver runs here with a temporary folder as its destination, fed by the real sender
through plain pipes instead of SSH (the netns tier proves the SSH path: test_cli_push.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vmrun import hostside
from vmrun.transfer import records
from vmrun.transfer.manifest import part_name
from vmrun.transfer.records import Outgoing, Piece, header, lanes_for, send_lanes
from vmrun.transfer.streams import OpenSshStream
from vmrun.transfer.types import Progress, Report

RECV = str(hostside.HERE / "transfer_recv.py")
HOSTILE = ["plain.txt", "with space", "new\nline", "-dash", "sub/deep/x.bin", "bad\udcffbyte"]


def receive(dest: Path, data: bytes) -> tuple[int, dict[bytes, str], str]:
    proc = subprocess.run([sys.executable, RECV, str(dest)], input=data, capture_output=True)
    lane = records.Lane()
    records.parse_results(proc.stdout, lane)
    return proc.returncode, lane.results, proc.stderr.decode()


def outgoing(
    root: Path, rel: str, data: bytes, mtime_ns: int = 1_600_000_000_123_456_789
) -> Outgoing:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    st = path.stat()
    folder, name = os.path.split(rel)
    temp = os.path.join(folder, part_name(name, st.st_size, st.st_mtime_ns))
    return Outgoing(rel, path, st.st_size, st.st_mtime_ns, 0o100754, temp=temp)


def whole(item: Outgoing, digest: bytes | None = None) -> bytes:
    data = item.path.read_bytes()
    return header(b"F", item, 0, item.size) + data + (digest or hashlib.sha256(data).digest())


def test_whole_files_arrive_exact_under_hostile_names(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    items = [outgoing(src, rel, os.urandom(100 * i + 1)) for i, rel in enumerate(HOSTILE)]
    status, results, err = receive(dest, b"".join(whole(i) for i in items))
    assert status == 0, err
    assert results == {os.fsencode(rel): "" for rel in HOSTILE}
    for item in items:
        there = dest / item.rel
        assert there.read_bytes() == item.path.read_bytes()
        assert there.stat().st_mtime_ns == item.mtime_ns
        assert there.stat().st_mode & 0o777 == 0o754 & ~_umask()
    assert not [p for p in dest.rglob("*") if p.name.endswith(".vmrun-part")]


def test_a_wrong_digest_places_nothing_and_the_stream_goes_on(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    bad, good = outgoing(src, "bad", b"x" * 5000), outgoing(src, "good", b"y" * 10)
    (dest / "in").mkdir(parents=True)
    blocked = outgoing(src, "in", b"z")  # a directory of that name is there
    status, results, _ = receive(dest, whole(bad, bytes(32)) + whole(blocked) + whole(good))
    assert status == 0
    assert "SHA-256" in results[b"bad"] and results[b"in"] and results[b"good"] == ""
    assert not (dest / "bad").exists() and (dest / "in").is_dir()
    assert sorted(p.name for p in dest.iterdir()) == ["good", "in"]  # no temporary left


def test_ranges_from_several_streams_each_verified_then_moved(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    data = os.urandom(3 * 1024 * 1024 + 17)
    item = outgoing(src, "big/model.bin", data)
    cuts = [(0, 1 << 20), (1 << 20, 1 << 20), (2 << 20, len(data) - (2 << 20))]

    def piece(at: int, n: int, digest: bytes | None = None) -> bytes:
        body = data[at : at + n]
        return header(b"R", item, at, n) + body + (digest or hashlib.sha256(body).digest())

    status, results, err = receive(dest, piece(*cuts[2]) + piece(*cuts[0], bytes(32)))
    assert status == 0 and "range from byte 0" in results[b"big/model.bin"], err
    for chunk in (piece(*cuts[2]) + piece(*cuts[0]), piece(*cuts[1])):  # two streams, any order
        status, results, err = receive(dest, chunk)
        assert status == 0 and results == {}, err  # nothing said of ranges that arrived well
    assert not (dest / "big/model.bin").exists()
    status, results, _ = receive(dest, header(b"M", item, 0, 0))
    assert status == 0 and results == {b"big/model.bin": ""}
    assert (dest / "big/model.bin").read_bytes() == data
    assert (dest / "big/model.bin").stat().st_mtime_ns == item.mtime_ns


def test_a_move_after_a_range_the_same_receiver_refused_places_nothing(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    data = os.urandom(2 << 20)
    item = outgoing(src, "model.bin", data)
    bad = header(b"R", item, 0, 1 << 20) + data[: 1 << 20] + bytes(32)
    good = data[1 << 20 :]
    good = header(b"R", item, 1 << 20, 1 << 20) + good + hashlib.sha256(good).digest()
    status, results, err = receive(dest, bad + good + header(b"M", item, 0, 0))
    assert status == 0 and "did not arrive intact" in results[b"model.bin"], err
    assert not (dest / "model.bin").exists()


def test_a_whole_copy_left_by_a_cut_upload_is_placed_only_by_its_digest(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    data = os.urandom(10_000)
    item = outgoing(src, "left.bin", data)
    dest.mkdir()
    (dest / item.temp).write_bytes(data)
    assert "SHA-256" in receive(dest, header(b"P", item, 0, 0) + bytes(32))[1][b"left.bin"]
    assert not (dest / item.temp).exists() and not (dest / "left.bin").exists()
    (dest / item.temp).write_bytes(data)
    good = header(b"P", item, 0, 0) + hashlib.sha256(data).digest()
    assert receive(dest, good)[1] == {b"left.bin": ""}
    assert (dest / "left.bin").read_bytes() == data


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "a/../../b"])
def test_an_unsafe_name_stops_the_receiver(tmp_path: Path, name: str) -> None:
    item = Outgoing(name, tmp_path, 1, 0, 0o644, temp=name)
    status, _, err = receive(tmp_path / "dest", header(b"F", item, 0, 1) + b"x" + bytes(32))
    assert status != 0 and "unsafe name" in err
    assert not (tmp_path / "escape").exists() and not Path("/tmp/abs").exists()


def test_a_cut_stream_fails_and_leaves_no_final_name(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    item = outgoing(src, "cut.bin", os.urandom(200_000))
    status, results, err = receive(dest, whole(item)[:100_000])
    assert status != 0 and "ended inside a record" in err and results == {}
    assert not (dest / "cut.bin").exists()


def test_lanes_cut_big_files_and_balance_bytes(tmp_path: Path) -> None:
    big = Outgoing("big", tmp_path, 200 << 20, 0, 0o644)
    small = [Outgoing(f"s{i}", tmp_path, 1 << 20, 0, 0o644) for i in range(8)]
    one = lanes_for([big, *small], 1)
    assert len(one) == 1 and one[0].work == [big, *small]
    four = lanes_for([big, *small], 4)
    assert len(four) == 4 and all(lane.shared is four[0].shared for lane in four)
    pieces = list(four[0].shared)  # taken by whichever stream is free: none is fixed
    assert all(isinstance(p, Piece) and p.item is big for p in pieces)
    step = -(-(200 << 20) // 16 // (1 << 20)) * (1 << 20)  # 4 ranges a stream, whole MiBs
    assert [(p.offset, p.length) for p in pieces] == [
        (at, min(step, (200 << 20) - at)) for at in range(0, 200 << 20, step)
    ]
    assert [lane.nbytes for lane in four] == [2 << 20] * 4  # the small files, in runs
    assert [w.rel for w in four[0].work] == ["s0", "s1"]


class _PipeEngine:
    """Runs the receiver here instead of through ssh (the command names the host's copy)."""

    name = "pipe"

    def __init__(self, dest: Path):
        self.dest = dest
        self.opened = 0

    def open(self, command: str) -> OpenSshStream:
        self.opened += 1
        return OpenSshStream([sys.executable, RECV, str(self.dest)], "local")


class _LocalConn:
    label = "local"

    def __init__(self, dest: Path):
        self.dest = dest

    asked = 0

    def capture(self, command: str, *, stdin: bytes, what: str) -> tuple[int, bytes, str]:
        self.asked += 1
        proc = subprocess.run(
            [sys.executable, RECV, str(self.dest)], input=stdin, capture_output=True
        )
        return proc.returncode, proc.stdout, proc.stderr.decode()


def test_send_lanes_moves_a_tree_over_several_streams(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(records, "PARALLEL_BYTES", 1 << 20)
    src, dest = tmp_path / "src", tmp_path / "dest"
    items = [outgoing(src, rel, os.urandom(3000 * (i + 1))) for i, rel in enumerate(HOSTILE)]
    items.append(outgoing(src, "big.bin", os.urandom((5 << 20) + 3)))
    engine = _PipeEngine(dest)
    report = Report("local")
    conn = _LocalConn(dest)
    ok = send_lanes(conn, engine, "dest", items, 3, None, Progress(), report)  # type: ignore[arg-type]
    assert ok and engine.opened == 3
    assert conn.asked == 0  # the big file was placed on the first stream: no round trip after
    assert {i.rel: i.why for i in items} == {i.rel: "" for i in items}
    for item in items:
        assert (dest / item.rel).read_bytes() == item.path.read_bytes()
    assert report.wire_bytes >= sum(i.size for i in items)


def test_streams_started_early_are_used_and_the_ones_left_over_end(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(records, "PARALLEL_BYTES", 1 << 20)
    src, dest = tmp_path / "src", tmp_path / "dest"
    item = outgoing(src, "big.bin", os.urandom((2 << 20) + 5))
    engine = _PipeEngine(dest)
    opened = records.Opened.start(engine, str(item.path), "dest", 4)  # type: ignore[arg-type]
    early = list(opened.streams)
    assert engine.opened == 4 and len(records.lanes_for([item], 2)) == 2
    report = Report("local")
    ok = send_lanes(_LocalConn(dest), engine, "dest", [item], 2, None, Progress(), report, opened)  # type: ignore[arg-type]
    assert ok and item.why == "" and engine.opened == 4  # none opened anew
    assert (dest / "big.bin").read_bytes() == item.path.read_bytes()
    assert opened.streams == [] and opened.unused == early[2:]  # not waited for meanwhile
    opened.close()
    assert all(s.proc.poll() is not None for s in early) and opened.unused == []


def test_a_stream_started_early_and_not_needed_makes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "not-yet"
    opened = records.Opened.start(_PipeEngine(dest), "x", "d", 3)  # type: ignore[arg-type]
    streams = list(opened.streams)
    assert opened.take(0) == [] and len(opened.unused) == 3
    opened.close()
    assert [s.proc.returncode for s in streams] == [0, 0, 0]
    assert not dest.exists()  # its receiver makes DIR only when a record comes


class _Delaying(_PipeEngine):
    """The first stream sends nothing until the second has sent a range, and the second
    flips a byte of every range it carries: the second stream surely refuses one."""

    def __init__(self, dest: Path):
        super().__init__(dest)
        self.second_sent = threading.Event()

    def open(self, command: str) -> OpenSshStream:
        stream = super().open(command)
        plain, index = stream.send, self.opened

        def send(data: bytes | bytearray | memoryview) -> None:
            if index == 1:
                assert self.second_sent.wait(30)
            elif index == 2 and len(data) >= 1 << 20:
                data = bytes([data[0] ^ 1]) + bytes(data[1:])
                plain(data)
                self.second_sent.set()
                return
            plain(data)

        stream.send = send  # type: ignore[method-assign]
        return stream


def test_a_range_another_stream_refused_keeps_the_file_from_being_placed(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(records, "PARALLEL_BYTES", 1 << 20)
    src, dest = tmp_path / "src", tmp_path / "dest"
    item = outgoing(src, "big.bin", os.urandom((4 << 20) + 9))
    conn, engine = _LocalConn(dest), _Delaying(dest)
    ok = send_lanes(conn, engine, "dest", [item], 2, None, Progress(), Report("local"))  # type: ignore[arg-type]
    assert ok and "SHA-256" in item.why, item.why
    assert not (dest / "big.bin").exists() and conn.asked == 0  # no M, here or after


def test_a_file_changed_here_while_its_ranges_went_is_not_placed(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(records, "PARALLEL_BYTES", 1 << 20)
    src, dest = tmp_path / "src", tmp_path / "dest"
    item = outgoing(src, "big.bin", os.urandom((3 << 20) + 1))
    os.utime(item.path, ns=(item.mtime_ns + 10**9, item.mtime_ns + 10**9))  # same size, edited
    conn = _LocalConn(dest)
    ok = send_lanes(conn, _PipeEngine(dest), "dest", [item], 3, None, Progress(), Report("l"))  # type: ignore[arg-type]
    assert ok and item.why == "changed here while it was being sent"
    assert not (dest / "big.bin").exists() and conn.asked == 0


def test_send_lanes_says_when_the_host_has_no_python(tmp_path: Path) -> None:
    class NoPython(_PipeEngine):
        def open(self, command: str) -> OpenSshStream:
            return OpenSshStream(["sh", "-c", "exec no-such-python3-here"], "local")

    item = outgoing(tmp_path / "src", "a", b"data")
    report = Report("local")
    ok = send_lanes(
        _LocalConn(tmp_path), NoPython(tmp_path), "d", [item], 1, None, Progress(), report
    )  # type: ignore[arg-type]
    assert not ok


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_range_sender_answers_each_request_in_order(tmp_path: Path) -> None:
    from vmrun.transfer.receive import COUNT, REQUEST

    data = os.urandom(3 << 20)
    (tmp_path / "new\nline").write_bytes(data)
    name = os.fsencode(str(tmp_path / "new\nline"))
    asks = [
        (1 << 20, 1 << 20, name),
        (0, 10, os.fsencode(str(tmp_path / "none"))),
        ((3 << 20) - 5, 100, name),
        (0, 7, name),
    ]
    requests = b"".join(REQUEST.pack(at, n, len(p)) + p for at, n, p in asks)
    send = str(hostside.HERE / "transfer_send.py")
    out = subprocess.run([sys.executable, send], input=requests, capture_output=True).stdout
    answers = []
    while out:
        (count,) = COUNT.unpack(out[:8])
        body, out = out[8 : 8 + max(count, 0)], out[8 + max(count, 0) :]
        answers.append((count, body))
    assert (
        answers
        == [
            (1 << 20, data[1 << 20 : 2 << 20]),
            (-1, b""),  # cannot be read
            (5, data[-5:]),  # only what the file has
            (7, data[:7]),
        ]
    )


def test_the_hop_sender_packs_what_it_can_read_and_says_what_it_could_not(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 5000)
    listing = tmp_path / "list"
    listing.write_bytes(b"gone\0a\0")
    pack = [sys.executable, str(hostside.HERE / "transfer_pack.py"), str(src), str(listing)]
    done = subprocess.run(pack, capture_output=True)
    assert done.returncode == 3 and b"gone" in done.stderr
    status, results, _ = receive(dest, done.stdout)
    assert status == 0 and results == {b"a": ""} and (dest / "a").read_bytes() == b"a" * 5000


def test_a_file_cut_in_its_middle_continues_from_what_the_host_holds(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    data = os.urandom(3 << 20)
    item = outgoing(src, "sub/big.bin", data)
    (dest / "sub").mkdir(parents=True)
    (dest / item.temp).write_bytes(data[:1_000_000])  # what a cut upload left

    def rest() -> bytes:
        at = 1_000_000
        return header(b"F", item, at, len(data) - at) + data[at:] + hashlib.sha256(data).digest()

    status, results, err = receive(dest, rest())
    assert status == 0 and results == {b"sub/big.bin": ""}, err
    assert (dest / "sub/big.bin").read_bytes() == data
    (dest / item.temp).write_bytes(b"x" * 1_000_000)  # a prefix that is not the file's
    assert "SHA-256" in receive(dest, rest())[1][b"sub/big.bin"]
    assert not (dest / item.temp).exists()  # refused, and nothing kept to resume from
    status, results, _ = receive(dest, rest())  # the part gone: said, the stream goes on
    assert status == 0 and "part to resume from" in results[b"sub/big.bin"]
