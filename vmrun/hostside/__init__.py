"""Scripts that run on the hosts, under the host's own Python (stdlib only).

They are sent as `python -c SOURCE ARGS...` and never imported by the CLI; `source(name)`
reads one so the caller can send it.
"""

from __future__ import annotations

from pathlib import Path


def source(name: str) -> str:
    return (Path(__file__).resolve().parent / f"{name}.py").read_text(encoding="utf-8")
