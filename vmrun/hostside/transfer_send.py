"""python3 THIS < REQUESTS (vmrun.transfer.receive): ranges of files for a fetch that runs
several streams at once. Each request is a header (offset, length, len(path)) and the path;
each answer is the count of bytes that follow (-1: the file cannot be read), then those
bytes, sent by sendfile(2). A file that shrinks meanwhile is padded with zeros: the fetch's
SHA-256 check then refuses it.
"""

import os
import struct
import sys

REQUEST = struct.Struct(">QQI")
COUNT = struct.Struct(">q")


def read_exact(size):
    parts, have = [], 0
    while have < size:
        data = os.read(0, size - have)
        if not data:
            break
        parts.append(data)
        have += len(data)
    return b"".join(parts)


def write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def send(path, offset, length):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        write_all(COUNT.pack(-1))
        return
    try:
        count = max(0, min(length, os.fstat(fd).st_size - offset))
        write_all(COUNT.pack(count))
        left, at = count, offset
        while left:
            try:
                sent = os.sendfile(1, fd, at, min(left, 1 << 24))
            except OSError:
                sent = 0
            if sent == 0:  # shrank, or no sendfile to this output
                data = os.pread(fd, min(left, 1 << 20), at) or bytes(min(left, 1 << 20))
                write_all(data)
                sent = len(data)
            left -= sent
            at += sent
    finally:
        os.close(fd)


def main():
    while True:
        head = read_exact(REQUEST.size)
        if len(head) < REQUEST.size:
            return
        offset, length, size = REQUEST.unpack(head)
        send(read_exact(size), offset, length)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        sys.exit(1)
