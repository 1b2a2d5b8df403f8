"""The merged log of a multi-node run: lines cut and prefixed per node."""

from __future__ import annotations

from vmrun.runs.nodes import Prefixer


def test_rank_prefixes_become_host_and_rank_and_partial_lines_wait() -> None:
    out: list[bytes] = []
    p = Prefixer("gpu2", out.append)
    p.feed(b"[rank3]:epoch 1/5 loss 0.5\n[rank2]:hal")
    assert out == [b"[gpu2 rank3] epoch 1/5 loss 0.5\n"]
    p.feed(b"f a line\nW1123 torchrun says something\n")
    p.feed(b"no newline at the end")
    p.flush()
    assert out[1:] == [b"[gpu2 rank2] half a line\n", b"[gpu2] W1123 torchrun says something\n",
                       b"[gpu2] no newline at the end\n"]
