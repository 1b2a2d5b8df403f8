"""runs.lines: torchrun's tee'd output back into whole, prefixed lines, its noise out."""

from __future__ import annotations

from vmrun.reporting import Recorder
from vmrun.runs.launch import RANK_PREFIX_TEMPLATE
from vmrun.runs.lines import Prefixer

BANNER = (
    b"\n*****************************************\n"
    b"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to"
    b" avoid your system being overloaded, please further tune the variable for optimal"
    b" performance in your application as needed. \n"
    b"*****************************************\n"
)
IPV6 = (
    b"[W1123 19:34:13.502671302 socket.cpp:764] [c10d] The IPv6 network addresses of"
    b" (n1, 29400) cannot be retrieved (gai error: -2 - Name or service not known).\n"
)


def run(host: str | None, chunks: list[bytes], verbose: bool = False) -> list[bytes]:
    out = Recorder()
    p = Prefixer(host, out, verbose=verbose)
    for chunk in chunks:
        p.feed(chunk)
    p.flush()
    return out.outputs


def test_a_line_torchrun_copied_in_two_pieces_is_whole_again() -> None:
    assert RANK_PREFIX_TEMPLATE.startswith("\x1e")
    # rank 0's line was half written when torchrun looked; rank 1's whole line came between
    chunks = [
        b"\x1e[rank0]:epoch 1 ",
        b"\x1e[rank1]:epoch 1 loss 0.5\n\x1e[ra",
        b"nk0]:loss 0.4\n",
        b"\x1e[rank1]:no newline",
    ]
    assert run(None, chunks) == [
        b"[rank1] epoch 1 loss 0.5\n",
        b"[rank0] epoch 1 loss 0.4\n",
        b"[rank1] no newline\n",
    ]
    assert run("gpu2", chunks)[:1] == [b"[gpu2 rank1] epoch 1 loss 0.5\n"]


def test_torchruns_banner_and_c10d_host_warnings_are_hidden_unless_verbose() -> None:
    worker_warning = b"\x1e[rank1]:" + IPV6
    chunks = [BANNER, IPV6, worker_warning, b"\x1e[rank0]:hello\n"]
    assert run(None, chunks) == [b"[rank0] hello\n"]
    assert run("n1", chunks) == [b"[n1 rank0] hello\n"]
    loud = run(None, chunks, verbose=True)
    assert b"".join(loud) == BANNER + IPV6 + b"[rank1] " + IPV6 + b"[rank0] hello\n"


def test_lines_that_only_look_like_part_of_the_banner_are_shown() -> None:
    chunks = [b"\n", b"****************************************\n", b"done\n", b"\n"]
    assert run(None, chunks) == [
        b"\n",
        b"****************************************\n",
        b"done\n",
        b"\n",
    ]
    user = b"\x1e[rank0]:The IPv6 network addresses of (me, 1) cannot be retrieved\n"
    assert run(None, [user]) == [
        b"[rank0] The IPv6 network addresses of (me, 1) cannot be retrieved\n"
    ]


def test_logs_of_older_runs_without_the_separator_are_still_prefixed() -> None:
    assert run("gpu2", [b"[rank3]:epoch 1/5\nW1123 torchrun\n"]) == [
        b"[gpu2 rank3] epoch 1/5\n",
        b"[gpu2] W1123 torchrun\n",
    ]
