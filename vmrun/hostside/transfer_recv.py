"""python3 THIS DIR < RECORDS (vmrun.transfer.records): files arriving for an upload, in one
pass. Each record is a header (vmrun.transfer.records.HEADER), its names, then its data:

- F (a whole file): written to its temporary name, hashed as it arrives; when the SHA-256
  that follows the data is the one computed here, given its mode and mtime and renamed over
  its final name at once, so no second pass reads it back and no round trip places it; with
  an offset, the rest of a temporary copy a cut upload left (its prefix hashed from disk);
- R (a range of a big file sent over several streams at once): written at its offset into the
  temporary name, which is made the file's full size, and hashed on the way; the range's
  SHA-256 follows its data; only a mismatch is reported;
- M (move): a file whose every range arrived and matched (each other stream's receiver
  reported nothing against it, and all ended well; sent on the first stream after its own
  ranges, which this receiver checked itself) is given its mode and mtime and placed;
- L (link): a symlink (its target is the data), made beside and renamed over its name;
- P (place): hash a temporary file that is whole (an earlier upload was cut after it), and
  place it as F does when the SHA-256 is the one sent.

Out: `+FINAL\\0` for each file placed, `-FINAL\\0WHY\\0` for each that was not. Names are
bytes relative to DIR, never absolute, never through `..`.
"""

import contextlib
import fcntl
import hashlib
import os
import struct
import sys

HEADER = struct.Struct(
    ">cIIQQQqI"
)  # kind, len(temp), len(final), offset, length, size, mtime_ns, mode
DIGEST = 32
CHUNK = 1 << 20


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = umask()


def safe(name):
    return name and not name.startswith(b"/") and b".." not in name.split(b"/")


class Reader:
    """Exact reads from stdin through one big buffer."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""
        self.pos = 0

    def read(self, size):
        if self.pos + size <= len(self.buf):
            data = self.buf[self.pos : self.pos + size]
            self.pos += size
            return data
        parts = [self.buf[self.pos :]]
        have = len(parts[0])
        self.buf, self.pos = b"", 0
        while have < size:
            more = os.read(self.fd, max(CHUNK, size - have))
            if not more:
                break
            if have + len(more) > size:
                cut = size - have
                parts.append(more[:cut])
                self.buf, self.pos = more, cut
                have = size
                break
            parts.append(more)
            have += len(more)
        return b"".join(parts)


MADE: set = set()  # folders known to exist: one mkdir per folder, not one per file


def make_parent(name):
    parent = os.path.dirname(name)
    if parent and parent not in MADE:
        os.makedirs(parent, exist_ok=True)
        MADE.add(parent)


def create(temp, mode):
    """A new file for `temp` (a stale one of that name is replaced) with `mode` less the
    umask, as tar gives it: no chmod afterwards."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return os.open(temp, flags, mode)
    except FileExistsError:
        os.unlink(temp)
        return os.open(temp, flags, mode)


def take(src, open_file, at, length, digest=None):
    """`length` bytes of the stream, read whatever happens to the file, written at `at` into
    the file `open_file()` opens, and hashed (into `digest`, when given: a resumed file's
    prefix is in it): (digest, why it failed or "", the open fd or -1)."""
    digest, why, fd = digest or hashlib.sha256(), "", -1
    try:
        fd = open_file()
    except OSError as exc:
        why = exc.strerror or str(exc)
    left = length
    while left:
        data = src.read(min(CHUNK, left))
        if not data:
            raise EOFError
        digest.update(data)
        view = memoryview(data)
        while fd >= 0 and view:
            try:
                view = view[os.pwrite(fd, view, at + len(data) - len(view)) :]
            except OSError as exc:
                why = exc.strerror or str(exc)
                os.close(fd)
                fd = -1
        at += len(data)
        left -= len(data)
    return digest, why, fd


def whole(src, temp, final, offset, size, mtime_ns, mode):
    """An F record: its data and digest are read whatever happens to the file here. Placed
    (mtime set on the open file, then renamed: rename(2) refuses to replace a directory)
    only when the SHA-256 is the one sent. From `offset` > 0 it continues the temporary
    copy an upload cut short left: its first `offset` bytes are hashed from the disk."""
    digest = hashlib.sha256()

    def open_file():
        make_parent(temp)
        if not offset:
            return create(temp, mode & 0o7777)
        try:
            fd = os.open(temp, os.O_RDWR)
        except FileNotFoundError:
            raise FileNotFoundError(2, "the part to resume from is gone") from None
        try:
            if os.fstat(fd).st_size < offset:
                raise FileNotFoundError(2, "the part to resume from is shorter than it was")
            os.ftruncate(fd, offset)
            at = 0
            while at < offset:
                data = os.pread(fd, min(4 * CHUNK, offset - at), at)
                if not data:
                    raise FileNotFoundError(2, "the part to resume from shrank")
                digest.update(data)
                at += len(data)
        except OSError:
            os.close(fd)
            raise
        return fd

    digest, why, fd = take(src, open_file, offset, size - offset, digest)
    sent = src.read(DIGEST)
    if len(sent) != DIGEST:
        raise EOFError
    if not why and digest.digest() != sent:
        why = "SHA-256 on the host differs from the one sent"
    return settle(fd, temp, final, mtime_ns, why)


def settle(fd, temp, final, mtime_ns, why):
    """Close a received file and place it, unless `why` says it is not good."""
    if fd >= 0:
        try:
            if not why:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        except OSError as exc:
            why = exc.strerror or str(exc)
        os.close(fd)
    if not why:
        try:
            os.replace(temp, final)
        except OSError as exc:
            why = exc.strerror or str(exc)
    if why:
        with_suppressed(os.unlink, temp)
    return why


def place(temp, final, mtime_ns, mode):
    os.chmod(temp, mode & 0o7777 & ~UMASK)
    os.utime(temp, ns=(mtime_ns, mtime_ns))
    os.replace(temp, final)


def ranged(src, temp, offset, length, size):
    """An R record: its bytes written at their offset, hashed on the way; its data and the
    range's SHA-256 after it are read whatever happens to the file here."""

    def open_file():
        make_parent(temp)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT, 0o600)
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        return fd

    digest, why, fd = take(src, open_file, offset, length)
    sent = src.read(DIGEST)
    if len(sent) != DIGEST:
        raise EOFError
    if fd >= 0:
        os.close(fd)
    if not why and digest.digest() != sent:
        why = f"SHA-256 on the host of the range from byte {offset} differs from the one sent"
    return why


def check_and_place(src, temp, final, mtime_ns, mode):
    sent = src.read(DIGEST)
    if len(sent) != DIGEST:
        raise EOFError
    digest = hashlib.sha256()
    try:
        with open(temp, "rb", buffering=0) as fh:
            while data := fh.read(4 * CHUNK):
                digest.update(data)
    except OSError as exc:
        return exc.strerror or str(exc)
    if digest.digest() != sent:
        with_suppressed(os.unlink, temp)
        return "SHA-256 on the host differs from the one sent"
    try:
        place(temp, final, mtime_ns, mode)
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def move(temp, final, mtime_ns, mode, refused):
    """An M record: place a ranged file, unless this receiver refused one of its ranges (the
    other streams' refusals the sender knows: it sends no M then)."""
    if temp in refused:
        return "a range of it did not arrive intact"
    try:
        place(temp, final, mtime_ns, mode)
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def link(target, temp, final):
    """An L record (a host-to-host hop's symlink inside the tree): made beside, renamed over."""
    try:
        make_parent(temp)
        with_suppressed(os.unlink, temp)
        os.symlink(target, temp)
        os.replace(temp, final)
    except OSError as exc:
        with_suppressed(os.unlink, temp)
        return exc.strerror or str(exc)
    return ""


def with_suppressed(func, *args):
    with contextlib.suppress(OSError):
        func(*args)


def record(src, head, told):
    """One record, whose header is `head`: (its final name, why it failed; "" when it was
    placed; None when nothing is to be said: a range that arrived well, or a second range
    of a file already told)."""
    if len(head) != HEADER.size:
        raise EOFError
    kind, tlen, flen, offset, length, size, mtime_ns, mode = HEADER.unpack(head)
    temp, final = src.read(tlen), src.read(flen)
    if not (safe(temp) and safe(final)):
        sys.exit("transfer-recv: an unsafe name in the stream")
    if kind == b"F":
        return final, whole(src, temp, final, offset, size, mtime_ns, mode)
    if kind == b"R":
        why = ranged(src, temp, offset, length, size)
        if not why or temp in told:
            return final, None
        told.add(temp)  # one line for a file whatever number of its ranges failed
        return final, why
    if kind == b"P":
        return final, check_and_place(src, temp, final, mtime_ns, mode)
    if kind == b"L":
        return final, link(src.read(length), temp, final)
    if kind == b"M":  # every range arrived and matched its SHA-256: only place it
        return final, move(temp, final, mtime_ns, mode, told)
    sys.exit("transfer-recv: a bad record in the stream")


def main():
    with contextlib.suppress(OSError):  # 1 MiB at a time through the pipe, not 64 KiB
        fcntl.fcntl(0, 1031, 1 << 20)  # F_SETPIPE_SZ
    src, said = Reader(0), []
    told: set = set()
    head = src.read(HEADER.size)
    if not head:  # a stream started early and not needed: nothing made, not even DIR
        return
    os.makedirs(sys.argv[1], exist_ok=True)
    os.chdir(sys.argv[1])
    while head:
        final, why = record(src, head, told)
        if why is not None:
            said.append(
                b"-" + final + b"\0" + why.encode() + b"\0" if why else b"+" + final + b"\0"
            )
        head = src.read(HEADER.size)
    sys.stdout.buffer.write(b"".join(said))


if __name__ == "__main__":
    try:
        main()
    except EOFError:
        sys.exit("transfer-recv: the stream ended inside a record")
    except BrokenPipeError:
        sys.exit(1)
