"""python3 THIS SRC LIST (relay.sh send): the files and symlinks LIST names (NUL-separated,
relative to SRC) as records for transfer_recv.py on the next host (its header, names, data;
a file's SHA-256 after its bytes, computed while reading them), so each is verified and
placed there as it arrives. Every 8 MiB a line `vmrun-relay-sent BYTES` on stderr. Exit 3
when a file could not be read (the others are sent).
"""

import contextlib
import fcntl
import hashlib
import os
import stat
import struct
import sys

HEADER = struct.Struct(">cIIQQQqI")  # transfer_recv.py's
CHUNK = 1 << 20
SUFFIX = b".vmrun-part"
EVERY = 8 << 20


def part_name(name, size, mtime_ns):
    """vmrun.transfer.manifest.part_name, on bytes."""
    token = b"%x-%x" % (size, mtime_ns & (2**64 - 1))
    candidate = b"." + name + b"." + token + SUFFIX
    if len(candidate) <= 255:
        return candidate
    return b".vmrun-" + hashlib.sha256(name).hexdigest()[:24].encode() + b"." + token + SUFFIX


class Out:
    def __init__(self):
        self.sent = 0
        self.told = 0

    def write(self, data):
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]

    def count(self, n):
        self.sent += n
        if self.sent - self.told >= EVERY:
            self.told = self.sent
            sys.stderr.write(f"tar: vmrun-relay-sent {self.sent}\n")
            sys.stderr.flush()


def record(kind, temp, final, size, st, length=None):
    return (
        HEADER.pack(
            kind,
            len(temp),
            len(final),
            0,
            size if length is None else length,
            size,
            st.st_mtime_ns,
            st.st_mode & 0o7777,
        )
        + temp
        + final
    )


def send_file(out, rel, st):
    """An F record; once its header is out, its bytes follow whatever happens (zeros for
    what cannot be read, and a zero digest that transfer_recv.py refuses)."""
    folder, name = os.path.split(rel)
    temp = os.path.join(folder, part_name(name, st.st_size, st.st_mtime_ns))
    fd = os.open(rel, os.O_RDONLY)
    good = True
    try:
        out.write(record(b"F", temp, rel, st.st_size, st))
        digest, left = hashlib.sha256(), st.st_size
        while left:
            try:
                data = os.read(fd, min(CHUNK, left))
            except OSError:
                data = b""
            if not data:  # shrank, or unreadable
                data, good = bytes(min(CHUNK, left)), False
            digest.update(data)
            out.write(data)
            left -= len(data)
            out.count(len(data))
        try:
            grew = bool(os.read(fd, 1))
        except OSError:
            grew = True
        out.write(digest.digest() if good and not grew else bytes(32))
    finally:
        os.close(fd)
    return good


def main():
    with contextlib.suppress(OSError):  # 1 MiB at a time through the pipe, not 64 KiB
        fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ
    src, listing = sys.argv[1], sys.argv[2]
    with open(listing, "rb") as fh:
        names = [n for n in fh.read().split(b"\0") if n]
    os.chdir(src)
    out, failed = Out(), 0
    for rel in names:
        try:
            st = os.lstat(rel)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(rel)
                folder, name = os.path.split(rel)
                temp = os.path.join(folder, part_name(name, 0, st.st_mtime_ns))
                out.write(record(b"L", temp, rel, 0, st, len(target)))
                out.write(target)
            elif not send_file(out, rel, st):
                failed += 1
                sys.stderr.write(f"tar: {os.fsdecode(rel)}: changed or unreadable while sent\n")
        except OSError as exc:
            failed += 1
            sys.stderr.write(f"tar: {os.fsdecode(rel)}: {exc.strerror}\n")
    sys.exit(3 if failed else 0)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        sys.exit(1)
