"""The docs: the site builds strictly (a broken link or an unlisted page fails), and the short
README still reaches every page the guide moved out of it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

DOCS = ROOT / "docs"


def _hooks():  # docs/hooks.py is loaded by MkDocs from its path, not imported as a package
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _readme_links() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [link.split("#", 1)[0] for link in links if not re.match(r"[a-z]+:|#", link)]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    # The pages the hooks make: the README as home, the command reference, the test bed.
    assert "Quickstart: GPU hosts" in (tmp_path / "index.html").read_text()
    assert "Usage: vmrun sweep" in (tmp_path / "reference" / "cli" / "index.html").read_text()
    assert (tmp_path / "testbed" / "index.html").is_file()


def test_every_relative_link_of_the_readme_exists() -> None:
    links = _readme_links()
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to what is not there: {missing}"


def test_the_readme_links_every_docs_page() -> None:
    """Every section the README dropped has a page, and the README leads to each."""
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")}
    unlinked = sorted(pages - set(_readme_links()))
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_readme_keeps_ci_s_test_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'python3 -m pytest -m "not netns"' in readme
    assert re.search(r"^python3 -m pytest +#", readme, re.M)


def test_the_command_reference_has_every_command() -> None:
    from vmrun.cli.app import COMMANDS, HIDDEN

    page = _hooks().cli_reference()
    for name, _, _ in COMMANDS:
        assert (f"## vmrun {name}\n" in page) is (name not in HIDDEN)
        assert (f"Usage: vmrun {name} " in page) is (name not in HIDDEN)


def test_the_settings_page_names_every_key() -> None:
    from vmrun.config import CLOUD_KEYS, CLUSTER_KEYS, FIELDS, HOST_KEYS

    page = (DOCS / "settings.md").read_text(encoding="utf-8")
    missing = sorted(
        k for k in {*FIELDS, *HOST_KEYS, *CLUSTER_KEYS, *CLOUD_KEYS} if f"`{k}`" not in page
    )
    assert not missing, f"keys missing from docs/settings.md: {missing}"


def test_the_readme_stays_short() -> None:
    """What vmrun is, install, the quickstarts and a line per capability; the rest lives on
    the docs site."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 160, f"README.md has {lines} lines; move details to docs/"
