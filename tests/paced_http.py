"""A static file server that sends at a set rate, as a package index over a real network would
(the test hosts have no internet, and a local server sends a wheel in a blink, too fast for
any progress line). Run it where the downloader can reach it:

    python3 paced_http.py DIR MIB_PER_SECOND

It serves DIR (directory listings make any folder of wheels a pip/uv --find-links page; a path
that does not exist answers 404, so `--index-url http://HOST:PORT/none/` is an empty index),
and prints its port on the first line of stdout once it listens.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import time
from typing import Any

CHUNK = 64 * 1024


class PacedHandler(http.server.SimpleHTTPRequestHandler):
    rate = 64 * 2**20  # bytes a second

    def copyfile(self, source: Any, outputfile: Any) -> None:
        started, sent = time.monotonic(), 0
        while chunk := source.read(CHUNK):
            outputfile.write(chunk)
            sent += len(chunk)
            ahead = sent / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # the pace of the emulated link, not a wait for anything

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    directory, rate = sys.argv[1], float(sys.argv[2])
    PacedHandler.rate = int(rate * 2**20)
    handler = functools.partial(PacedHandler, directory=directory)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


if __name__ == "__main__":
    shutil.disk_usage(sys.argv[1])  # a missing folder fails here, before the port is said
    main()
