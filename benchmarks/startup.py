"""CLI start-up: `vmrun --help` / `--version` against a bare interpreter and `import typer`.

Goal (issue: foundation): both within 1.5x of `python -c 'import typer'`, and no paramiko,
fabric, rich or torch imported on paths that open no connection.

vmrun is timed as the console script this interpreter installed (run directly: its shebang
is the real interpreter) and as `python -m vmrun`, never as whatever `vmrun` PATH finds
first: under pyenv that is a bash shim that re-resolves the version on every call (tens of
ms that are pyenv's, not vmrun's). The shim is shown for reference when there is one.

    python benchmarks/startup.py [--runs 21]

Measured here (2 cores, console script, medians of 21): `import typer` 153 ms; `vmrun --help`
151 ms (0.99x), `vmrun exec --help` 164 ms (1.07x), `vmrun --version` 81 ms (0.53x). Building
only the named command is what keeps `--help` there (all 11 commands cost ~50 ms more).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


def median_ms(argv: list[str], runs: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of the process, in ms. CPU time
    barely moves when other work shares the cores; wall time is what a user waits."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append((time.perf_counter() - start) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        cpu.append(used * 1000)
    return statistics.median(wall), statistics.median(cpu)


def console_script() -> Path | None:
    """The `vmrun` script pip wrote next to this interpreter, if it is one (a shebang line)."""
    script = Path(sysconfig.get_path("scripts")) / "vmrun"
    try:
        with script.open("rb") as fh:
            first = fh.readline()
    except OSError:
        return None
    return script if first.startswith(b"#!") and b"python" in first else None


def heavy_imports(args: list[str]) -> list[str]:
    probe = (
        "import sys\nfrom vmrun.cli.main import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:' + ' '.join(m for m in ('paramiko', 'fabric', 'torch', 'rich',"
        " 'pydantic', 'matplotlib', 'tensorboard') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    line = [x for x in out.splitlines() if x.startswith("HEAVY:")][-1]
    return line.removeprefix("HEAVY:").split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    runs = parser.parse_args().runs
    script = console_script()
    module = [sys.executable, "-m", "vmrun"]
    cli = {"python -m vmrun": module}
    if script is not None:
        cli = {"vmrun": [str(script)], **cli}
    rows = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -c 'import typer'", [sys.executable, "-c", "import typer"]),
    ]
    for name, argv in cli.items():
        rows += [
            (f"{name} --version", [*argv, "--version"]),
            (f"{name} --help", [*argv, "--help"]),
            (f"{name} exec --help", [*argv, "exec", "--help"]),
        ]
    on_path = shutil.which("vmrun")
    shim = on_path if on_path and not (script and os.path.samefile(on_path, script)) else None
    if shim:
        rows.append(("vmrun on PATH --version (ref)", [shim, "--version"]))
    results = {name: median_ms(argv, runs) for name, argv in rows}
    typer_ms, typer_cpu = results["python -c 'import typer'"]
    print(f"interpreter: {sys.executable}")
    print(f"vmrun console script: {script or 'none installed for this interpreter'}")
    if shim:
        print(f"vmrun on PATH: {shim} (not the console script; for reference only)")
    print(f"{'command':<34} {'median ms':>10} {'x typer':>8} {'cpu ms':>8} {'x typer':>8}")
    for name, (ms, cpu) in results.items():
        print(f"{name:<34} {ms:>10.1f} {ms / typer_ms:>8.2f} {cpu:>8.1f} {cpu / typer_cpu:>8.2f}")
    for args in (["--help"], ["--version"], ["exec", "--help"], ["status", "--help"]):
        loaded = heavy_imports(args)
        print(f"heavy modules after vmrun {' '.join(args)}: {', '.join(loaded) or 'none'}")


if __name__ == "__main__":
    main()
