"""The wheel carries what an installed vmrun needs: playbooks, the bundled trainer, host tools,
its type marker and its licence; the sdist carries the licence too."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

pytest.importorskip("hatchling", reason="the build backend (pip install -e '.[dev]')")


@pytest.mark.slow
def test_the_wheel_ships_playbooks_trainer_and_host_tools(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = tmp_path.glob("vmrun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for playbook in (ROOT / "playbooks").glob("*.yaml"):
        assert f"vmrun/playbooks/{playbook.name}" in names
    for module in ("vmrun/trainer/template.py", "vmrun/hostside/netprobe.py", "vmrun/cli/app.py"):
        assert module in names
    host_side = sorted(p for p in (ROOT / "vmrun" / "hostside").glob("[!_]*.*") if p.is_file())
    assert {"facts.sh", "run_start.sh", "sync_prepare.sh", "setup_pip_check.py"} <= {
        p.name for p in host_side
    }
    missing = [p.name for p in host_side if f"vmrun/hostside/{p.name}" not in names]
    assert not missing, f"host-side files missing from the wheel: {missing}"
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "vmrun").rglob("*.py"))
    left_out = [m for m in modules if m not in names]  # e.g. a package a .gitignore line hid
    assert not left_out, f"modules missing from the wheel: {left_out}"
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "vmrun = vmrun.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    static = sorted(p.name for p in (ROOT / "vmrun" / "dashboard" / "static").iterdir())
    assert {"index.html", "app.js", "uPlot.iife.min.js", "uPlot.LICENSE"} <= set(static)
    missing = [n for n in static if f"vmrun/dashboard/static/{n}" not in names]
    assert not missing, f"the dashboard's files missing from the wheel: {missing}"
    assert "vmrun/py.typed" in names  # PEP 561: a user's mypy reads vmrun's annotations
    licences = [n for n in names if ".dist-info/" in n and n.endswith("/LICENSE")]
    assert licences, "LICENSE missing from the wheel's metadata"
    assert zipfile.ZipFile(wheel).read(licences[0]) == (ROOT / "LICENSE").read_bytes()


@pytest.mark.slow
def test_the_sdist_ships_the_licence_and_the_type_marker(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hatchling.build import build_sdist; print(build_sdist(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    with tarfile.open(tmp_path / built.stdout.split()[-1]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "vmrun/py.typed", "pyproject.toml", "README.md"} <= names
