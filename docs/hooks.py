"""MkDocs hooks: the pages that are made from the repository at each build, so none goes stale.

- `index.md`: the README (its `docs/` links made relative to the site), so the site opens where
  the repository does;
- `testbed.md`: tests/testbed/README.md, which stays beside the code it explains;
- `reference/cli.md`: every command's `--help`, read from the Typer app itself.

`python docs/hooks.py` prints the command reference (what the site shows).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTBED = "tests/testbed/README.md"
# The help as a terminal of this width shows it: fixed, so every build writes the same page.
WIDTH = 100


def readme_page() -> str:
    """The README as the site's home page: `docs/X` links become `X`, the test bed's its page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = text.replace(f"]({TESTBED})", "](testbed.md)")
    return re.sub(r"\]\(docs/", "](", text)


def cli_reference() -> str:
    """One section per command, in `vmrun --help`'s order: what it does and its whole help."""
    import typer

    from vmrun.cli.app import COMMANDS, HIDDEN, build
    from vmrun.cli.options import HELP_ALL

    root = build(None)
    listed = [(name, short) for name, _, short in COMMANDS if name not in HIDDEN]
    ctx = typer.core.TyperCommand.context_class(
        root, info_name="vmrun", terminal_width=WIDTH, max_content_width=WIDTH
    )
    out = [
        "# Command reference",
        "",
        "Every command's `--help`, generated from the CLI at each build of these pages, with",
        "every option (`vmrun train --help` shows the ones most runs need; `--help-all`, this).",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| [`{name}`](#vmrun-{name}) | {short} |" for name, short in listed),
        "",
        "## vmrun",
        "",
        "```text",
        root.get_help(ctx).rstrip(),
        "```",
    ]
    for name, short in listed:
        sub = root.commands[name]
        sub_ctx = sub.context_class(
            sub, info_name=name, parent=ctx, terminal_width=WIDTH, max_content_width=WIDTH
        )
        sub_ctx.meta[HELP_ALL] = True  # every option, as `--help-all` shows them
        out += ["", f"## vmrun {name}", "", short, "", "```text", sub.get_help(sub_ctx).rstrip()]
        out.append("```")
    return "\n".join(out) + "\n"


def _generated() -> dict[str, str]:
    return {
        "index.md": readme_page(),
        "testbed.md": (ROOT / TESTBED).read_text(encoding="utf-8"),
        "reference/cli.md": cli_reference(),
    }


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, content in _generated().items():
        stale = files.get_file_from_path(uri)
        if stale is not None:
            files.remove(stale)
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """A page's link to the test bed's README (right on GitHub) points at its page here."""
    return markdown.replace(f"](../{TESTBED})", "](testbed.md)")


if __name__ == "__main__":
    print(cli_reference(), end="")
