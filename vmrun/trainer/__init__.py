"""vmrun's bundled trainer: `template.py` runs under torchrun on the GPU host (or here).

This package never imports torch itself: the CLI only needs the template's *path* to launch
it, and `vmrun train --help` must stay as light as every other command.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE_PATH = Path(__file__).resolve().with_name("template.py")
"""The script `vmrun train` runs when no SCRIPT is given."""

TEMPLATE_NAME = "template"
"""The run-id prefix for template runs (`template-20250101-120000-ab12`)."""

TEMPLATE_TASKS = ("regress", "classify")
"""The template's `--task` values (its TASKS; the first is its default)."""

ALLREDUCE_PATH = Path(__file__).resolve().with_name("allreduce.py")
"""The short all-reduce `vmrun doctor` runs across the nodes."""


def is_bundled(script: Path) -> bool:
    """A script that ships with vmrun: uploaded to the host, not synced with the project."""
    return script.resolve().parent == TEMPLATE_PATH.parent
