"""python3 -c THIS < "tmp\0final\0...": rename each pair in one process (transfer_place.sh),
refusing to replace a directory, as `mv -T` would. Any python3 the host has runs it."""

import os
import sys

words = sys.stdin.buffer.read().split(b"\0")[:-1]
for i in range(0, len(words) - 1, 2):
    tmp, final = words[i], words[i + 1]
    if os.path.isdir(final) and not os.path.islink(final):
        sys.exit(f"mv: cannot overwrite directory {final!r}")
    os.replace(tmp, final)
