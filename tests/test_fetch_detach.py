"""Detaching from `train --fetch-every` (Ctrl-C) is immediate: a fetch round under way is cut
short, its streams killed, and what it had received stays under a temporary name, to resume
next time; never a partial file under its final name. Quick tier: a fake engine whose
stream stalls mid-file, and a fake host group."""

from __future__ import annotations

import hashlib
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_for

from vmrun.backends.api import RunRef
from vmrun.backends.hosts import training
from vmrun.errors import Detached, Interrupted
from vmrun.reporting import Recorder
from vmrun.ssh.group import Outcome
from vmrun.transfer import download as download_mod
from vmrun.transfer.manifest import PART_SUFFIX, Entry
from vmrun.transfer.receive import Item
from vmrun.transfer.types import Cancel, Options, Progress, Report

SIZE = (5 << 20) + 7  # over receive.SMALL: spliced through copy_to, as checkpoints are
DATA = bytes(range(256)) * (SIZE // 256) + b"x" * (SIZE % 256)
FIRST = 1 << 20  # what arrives before the stream stalls


class _Stream:
    """A remote command's output: `data`, then (with `stall`) nothing until killed."""

    def __init__(self, data: bytes, stall: bool):
        self.data, self.pos, self.stall = data, 0, stall
        self.killed = threading.Event()

    def _take(self, size: int) -> bytes:
        if self.pos >= len(self.data) and self.stall:
            self.killed.wait(60)
        chunk = self.data[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk

    def send(self, data: bytes | memoryview) -> None:
        pass

    def close_input(self) -> None:
        pass

    def read(self, size: int) -> bytes:
        return self._take(size)

    def copy_to(self, fd: int, count: int, on_chunk) -> int:  # type: ignore[no-untyped-def]
        done = 0
        while done < count:
            chunk = self._take(min(count - done, 1 << 16))
            if not chunk:
                break
            os.write(fd, chunk)
            done += len(chunk)
            on_chunk(len(chunk))
        return done

    def finish(self) -> tuple[int, str]:
        return (-1, "killed") if self.killed.is_set() else (0, "")

    def kill(self) -> None:
        self.killed.set()


class _Engine:
    name = "fake"

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.streams: list[_Stream] = []

    def open(self, command: str) -> _Stream:
        self.commands.append(command)
        if " tail " in f" {command} ":  # resuming: the rest of the file, to its end
            start = int(command.split("+")[1].split()[0]) - 1
            stream = _Stream(DATA[start:], stall=False)
        else:  # the tar stream: a header, the first MiB, then silence (a stalled link)
            info = tarfile.TarInfo("./run/big.pt")
            info.size = SIZE
            stream = _Stream(info.tobuf(format=tarfile.GNU_FORMAT) + DATA[:FIRST], stall=True)
        self.streams.append(stream)
        return stream


class _Conn:
    label = "h1"

    def close(self) -> None:
        pass


def _item(dest: Path) -> Item:
    entry = Entry(rel="", kind="f", size=SIZE, mtime_ns=1_700_000_000 * 10**9, mode=0o644)
    return Item(remote="run/big.pt", local=dest / "big.pt", entry=entry, display="big.pt")


def test_a_stopped_fetch_ends_at_once_leaving_a_partial_that_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _Engine()
    hashed = threading.Event()

    def slow_hashes(conn: object, paths: list[str]) -> dict[str, str]:
        hashed.wait(60)  # the host still hashing a big file: not waited for once stopped
        return {"run/big.pt": hashlib.sha256(DATA).hexdigest()}

    monkeypatch.setattr(download_mod, "plan_streams", lambda *a, **kw: (engine, 1))
    monkeypatch.setattr(download_mod, "remote_hashes", slow_hashes)
    cancel = Cancel()
    options = Options(cancel=cancel)
    outcome: list[BaseException | None] = []

    def fetch() -> None:
        try:
            download_mod._transfer(_Conn(), [_item(tmp_path)], options, Progress(), Report("h1"))  # type: ignore[arg-type]
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    parts = lambda: list(tmp_path.glob(f".big.pt.*{PART_SUFFIX}"))  # noqa: E731
    wait_for(lambda: parts() and parts()[0].stat().st_size >= FIRST, 30, "the first MiB")
    started = time.monotonic()
    cancel.set()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - started < 2
    assert isinstance(outcome[0], Interrupted), outcome
    assert engine.streams[0].killed.is_set()
    assert not (tmp_path / "big.pt").exists()  # never a partial file under the final name
    (part,) = parts()
    assert part.read_bytes() == DATA[:FIRST]
    # next time: it resumes from the partial file (`tail -c +N`), and the file is placed whole
    hashed.set()
    failed = download_mod._transfer(_Conn(), [_item(tmp_path)], Options(), Progress(), Report("h1"))  # type: ignore[arg-type]
    assert failed == []
    assert f"tail -c +{FIRST + 1} " in engine.commands[-1], engine.commands
    assert (tmp_path / "big.pt").read_bytes() == DATA and not parts()


class _Group:
    """Hosts whose fetch never ends on its own (a stalled link): each holds a kill with the
    round's Cancel, as the streams do."""

    def __init__(self) -> None:
        self.fetching = threading.Event()
        self.connections = {"h1": _Conn()}

    def map(self, fn, only=None):  # type: ignore[no-untyped-def]
        try:  # as the real Group: each host's error is its outcome
            return [Outcome("h1", fn(None, _Conn()), None, 0.0)]
        except BaseException as exc:
            return [Outcome("h1", None, exc, 0.0)]


def test_detaching_from_fetch_every_does_not_wait_for_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train --fetch-every`'s follow ends with Detached (Ctrl-C) while a round is stuck
    mid-transfer: vmrun returns at once (it waited up to 600 s for the round)."""
    import vmrun.runs.outputs as outputs
    import vmrun.transfer.download as dl

    group = _Group()

    def stuck(conn: object, specs: object, dest: Path, options: Options) -> object:
        unblock = threading.Event()
        if options.cancel is not None:
            options.cancel.hold(unblock.set)
        group.fetching.set()
        unblock.wait(60)
        if options.cancel is not None:
            options.cancel.check()
        raise AssertionError("the round was not cut short")

    monkeypatch.setattr(outputs, "locate_run", lambda conn, rid: object())
    monkeypatch.setattr(outputs, "resolve_what", lambda *a, **kw: [])
    monkeypatch.setattr(dl, "download", stuck)

    class Backend:
        def __init__(self) -> None:
            self.group = group

        def follow(self, ref: RunRef, *a: object, **kw: object) -> int:
            wait_for(group.fetching.is_set, 30, "a fetch round to be under way")
            raise Detached("detached from run r1")

    class Plan:
        project = tmp_path
        hang_timeout = 0  # not watched: no hang spotter between the follow and `said`

    ref = RunRef(run_id="r1", nodes=("h1",))
    said = Recorder()
    started = time.monotonic()
    with pytest.raises(Detached):
        training._follow(Backend(), ref, Plan(), said, 0.05)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5, "detaching waited for the fetch round"
    # nothing said as it leaves
    assert not any("failed this round" in n for n in said.lines), said.lines
