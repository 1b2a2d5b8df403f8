"""A line plot in the terminal: braille dots (2 x 4 per character cell), one colour per run.

Small on purpose, so `vmrun plot` without -o needs nothing beyond rich: each line is drawn
point to point on a grid of dots; a cell takes the colour of the last run drawn through it,
so a run whose line is exactly an earlier one's says so in the legend (the earlier one is
under it, not missing).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][column] of a cell


class Canvas:
    """cols x rows character cells, each 2 x 4 dots; dot (0, 0) is the top left."""

    def __init__(self, cols: int, rows: int):
        self.cols, self.rows = cols, rows
        self.bits = [[0] * cols for _ in range(rows)]
        self.colour: list[list[str | None]] = [[None] * cols for _ in range(rows)]

    def dot(self, x: int, y: int, colour: str) -> None:
        if 0 <= x < self.cols * 2 and 0 <= y < self.rows * 4:
            self.bits[y // 4][x // 2] |= _BITS[y % 4][x % 2]
            self.colour[y // 4][x // 2] = colour

    def line(self, a: tuple[int, int], b: tuple[int, int], colour: str) -> None:
        steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
        for i in range(steps + 1):
            t = i / steps
            self.dot(round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t), colour)

    def row_text(self, row: int) -> Text:
        text = Text()
        for bits, colour in zip(self.bits[row], self.colour[row], strict=True):
            text.append(chr(0x2800 + bits) if bits else " ", style=colour or "")
        return text


def _number(value: float) -> str:
    return f"{value:.4g}"


def render(
    lines: Sequence[Sequence[tuple[float, float]]],
    names: Sequence[str],
    colours: Sequence[str],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int,
    height: int = 16,
) -> Text:
    """The plot as rich Text: title, y labels, the dots, the x axis, then the legend."""
    xs = [p[0] for pts in lines for p in pts]
    ys = [p[1] for pts in lines for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    x1 = x1 if x1 > x0 else x0 + 1
    ticks = {0: _number(y1), height // 2: _number((y0 + y1) / 2), height - 1: _number(y0)}
    margin = max(len(t) for t in ticks.values()) + 1
    cols = max(10, width - margin - 1)
    canvas = Canvas(cols, height)
    for points, colour in zip(lines, colours, strict=True):
        dots = [
            (
                round((x - x0) / (x1 - x0) * (cols * 2 - 1)),
                round((y1 - y) / (y1 - y0) * (height * 4 - 1)),
            )
            for x, y in points
        ]
        for a, b in zip(dots, dots[1:] or dots, strict=False):
            canvas.line(a, b, colour)
    out = Text(f"{title}\n", style="bold")
    out.append(f"{y_label}\n", style="dim")
    for row in range(height):
        out.append(ticks.get(row, "").rjust(margin - 1) + " │", style="dim")
        out.append_text(canvas.row_text(row))
        out.append("\n")
    out.append(" " * margin + "└" + "─" * cols + "\n", style="dim")
    left, right = _number(x0), _number(x1)
    gap = max(1, cols - len(left) - len(right) - len(x_label))
    axis = f"{left}{' ' * (gap // 2)}{x_label}{' ' * (gap - gap // 2)}{right}"
    out.append(" " * (margin + 1) + axis + "\n", style="dim")
    for i, (name, colour) in enumerate(zip(names, colours, strict=True)):
        out.append("  ━━ ", style=colour)
        under = [names[j] for j in range(i) if lines[j] and list(lines[j]) == list(lines[i])]
        out.append(f"{name}{f' (the same line as {under[0]}, over it)' if under else ''}\n")
    out.rstrip()  # the console ends the last line
    return out
