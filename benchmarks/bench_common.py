"""What the benchmarks share: command-line sizes."""

from __future__ import annotations


def parse_size(text: str) -> int:
    """`1G`, `200M`, `64KiB`, `1000`: bytes (K, M, G are powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text[-1:] in units else ""
    return int(float(text[: len(text) - len(unit)]) * units[unit])
