"""Symlinks fetched (or synced) stay inside their folder once resolved through each other,
not just as text: `a -> .` with `b -> a/..` reads as inside and leads to the parent."""

from __future__ import annotations

import os
import random
from pathlib import Path

from vmrun.sync.plan import classify
from vmrun.transfer.download import _place_links, _plan
from vmrun.transfer.manifest import Entry, RootListing, links_inside
from vmrun.transfer.types import FetchSpec, Options, Report


def test_chained_links_that_climb_out_are_refused() -> None:
    assert links_inside({"a": ".", "b": "a/.."}) == {"a"}
    assert links_inside({"d/l": "..", "d/m": "l/.."}) == {"d/l"}  # l is the root: m its parent
    assert links_inside({"x": "y/z", "y": "../out"}) == set()  # through a link that leaves
    assert links_inside({"p": "q", "q": "p", "r": "p/.."}) == set()  # a loop leads nowhere
    assert links_inside({"c": "sub", "sub": "real/deep", "e/f": "../c/.."}) == {"c", "sub", "e/f"}
    assert links_inside({"abs": "/etc", "up": "../x", "in": "d/../x"}) == {"in"}


def _make(root: Path, links: dict[str, str]) -> None:
    for rel, target in links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)


def test_every_link_accepted_resolves_inside_as_the_os_resolves_it(tmp_path: Path) -> None:
    """Random trees of links among each other: each one kept is inside by realpath too."""
    rng = random.Random(20)
    names = ["a", "b", "c", "d/e", "d/f"]
    parts = [".", "..", "a", "b", "c", "d", "e", "f"]
    for n in range(300):
        root = tmp_path / f"t{n}" / "run"
        root.mkdir(parents=True)
        links = {
            rel: "/".join(rng.choice(parts) for _ in range(rng.randint(1, 3)))
            for rel in rng.sample(names, rng.randint(1, len(names)))
        }
        if "d" in links:
            continue
        _make(root, links)
        real = os.path.realpath(root)
        for rel in links_inside(links):
            got = os.path.realpath(root / rel)
            assert got == real or got.startswith(real + "/"), (links, rel, got)


def test_fetch_places_a_and_skips_b_whose_chain_climbs_out(tmp_path: Path) -> None:
    entries = [
        Entry("", "d", 0, 0, 0o755),
        Entry("a", "l", 1, 0, 0o777, link="."),
        Entry("b", "l", 4, 0, 0o777, link="a/.."),
        Entry("f", "f", 3, 0, 0o644),
    ]
    spec = FetchSpec(remote="results/r1", local="results/r1")
    report = Report("h1")
    files, links = _plan(
        [(spec, RootListing("results/r1", "ok", entries))], 0, tmp_path, Options(), report
    )
    assert [item.display for item in files] == ["results/r1/f"]
    assert [shown for _, _, shown in links] == ["results/r1/a"]
    assert any(s.startswith("results/r1/b: symlink to 'a/..' outside") for s in report.skipped)
    _place_links(links, report)
    assert os.readlink(tmp_path / "results/r1/a") == "." and not os.path.lexists(
        tmp_path / "results/r1/b"
    )


def test_sync_skips_a_link_whose_chain_climbs_out_of_the_project(tmp_path: Path) -> None:
    _make(tmp_path, {"a": ".", "b": "a/..", "c": "a/x"})
    plan = classify(tmp_path, ["a", "b", "c"])
    assert plan.links == [("a", "."), ("c", "a/x")]
    assert len(plan.warnings) == 1 and plan.warnings[0].startswith("b: symlink to 'a/..'")
