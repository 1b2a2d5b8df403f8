"""CLI start-up: `vmrun --help` / `--version` against a bare interpreter and `import typer`.

Goal (issue: foundation): both within 1.5x of `python -c 'import typer'`, and no paramiko,
fabric, rich or torch imported on paths that open no connection.

    python benchmarks/startup.py [--runs 21]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def median_ms(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def heavy_imports(args: list[str]) -> list[str]:
    probe = (
        "import sys\nfrom vmrun.cli.main import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:' + ' '.join(m for m in ('paramiko', 'fabric', 'torch', 'rich',"
        " 'pydantic') if m in sys.modules))"
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
    vmrun = shutil.which("vmrun")
    cli = [vmrun] if vmrun else [sys.executable, "-m", "vmrun"]
    rows = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -c 'import typer'", [sys.executable, "-c", "import typer"]),
        ("vmrun --version", [*cli, "--version"]),
        ("vmrun --help", [*cli, "--help"]),
        ("vmrun exec --help", [*cli, "exec", "--help"]),
    ]
    results = {name: median_ms(argv, runs) for name, argv in rows}
    typer_ms = results["python -c 'import typer'"]
    print(f"{'command':<28} {'median ms':>10} {'x typer':>8}")
    for name, ms in results.items():
        print(f"{name:<28} {ms:>10.1f} {ms / typer_ms:>8.2f}")
    for args in (["--help"], ["--version"], ["exec", "--help"]):
        loaded = heavy_imports(args)
        print(f"heavy modules after vmrun {' '.join(args)}: {', '.join(loaded) or 'none'}")


if __name__ == "__main__":
    main()
