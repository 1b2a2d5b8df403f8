"""A host that cannot reach a package index, told apart from other failures by what pip (or
curl, uv, conda) printed, so the error says what to do instead of showing retry lines."""

from __future__ import annotations

import re

# what the tools print, and what it means; the first that matches a line wins
_SIGNS = (
    (
        re.compile(r"Network is unreachable|No route to host|\[Errno 101\]|\[Errno 113\]"),
        "no route out",
    ),
    (
        re.compile(
            r"Temporary failure in name resolution|Name or service not known|"
            r"Could not resolve host|failed to lookup address|\[Errno -[23]\]"
        ),
        "names do not resolve",
    ),
    (
        re.compile(
            r"Failed to establish a new connection|Connection timed out|"
            r"ConnectTimeoutError|Connection refused"
        ),
        "the index does not answer",
    ),
)

WAYS_FORWARD = (
    "give --wheelhouse DIR (wheels uploaded, installed with --no-index), --installer FILE (a"
    " Miniconda installer), or --python PATH with an interpreter the image already has"
)


def offline_reason(line: str) -> str:
    """Why the host could not download, from one output line; empty when it says nothing."""
    for pattern, reason in _SIGNS:
        if pattern.search(line):
            return reason
    return ""
