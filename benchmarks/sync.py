"""Project sync: vmrun's engines against plain `rsync -a -e ssh`, on a real sshd test host.

Picks the default engine of vmrun.sync.project (see its docstring). Needs root (a NetnsBed host).
Two projects: a 2,000 x 10 KiB tree and one 200 MiB file; for each, the cases take turns
round after round (a busy machine slows all alike) and the medians are printed:

- first sync into an empty work directory;
- re-sync with nothing changed (goal: vmrun <= 1.2x plain rsync for the tree);
- re-sync after one edit (one small file of the tree; 1 MiB in the middle of the big file).

vmrun rows run in this process and include `project_files` (the list is built each time);
"open" rows reuse one Connection, as `vmrun train` does (it connects once for everything),
"+connect" rows open a fresh one each time. Plain rsync gets the same host settings through a
generated ssh_config.

    sudo python benchmarks/sync.py [--rounds 5] [--files 2000] [--size 200M]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import parse_size  # noqa: E402


class Bench:
    def __init__(self, work: Path, host: object, keys: object, home: Path):
        from vmrun.config import load_settings
        from vmrun.ssh.connection import Connection

        self.host = host
        self.home = home
        self.cfg = home / ".ssh" / "config"
        self.env = {**os.environ, "HOME": str(home)}
        self.env.pop("SSH_AUTH_SOCK", None)
        self.settings = load_settings({}, cwd=work, environ=self.env)
        self.conn = Connection("bench", self.settings).open()
        self.counter = 0

    def fresh(self, label: str) -> str:
        self.counter += 1
        return f"bench-{label}-{self.counter}"

    def rsync(self, project: Path, dest: str) -> None:
        argv = ["rsync", "-a", "-e", f"ssh -F {self.cfg}", f"{project}/", f"bench:{dest}/"]
        subprocess.run(argv, check=True, env=self.env)

    def vmrun(self, project: Path, dest: str, engine: str, connect: bool) -> None:
        from vmrun.ssh.connection import Connection
        from vmrun.sync.project import sync_project

        if connect:
            with Connection("bench", self.settings) as conn:
                sync_project(conn, project, dest, engine=engine)
        else:
            sync_project(self.conn, project, dest, engine=engine)

    def cases(self, project: Path) -> dict[str, Callable[[str], None]]:
        cases: dict[str, Callable[[str], None]] = {
            "rsync -a -e ssh (by hand)": lambda d: self.rsync(project, d),
        }
        for engine in ("rsync", "vmrun", "auto"):
            for connect in (False, True):
                name = f"vmrun sync, {engine} engine, {'+connect' if connect else 'open'}"

                def go(d: str, engine: str = engine, connect: bool = connect) -> None:
                    self.vmrun(project, d, engine, connect)

                cases[name] = go
        return cases

    def clear(self, dest: str) -> None:
        self.host.run(["rm", "-rf", dest], as_user=True, timeout=120)  # type: ignore[attr-defined]


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def scenario(
    b: Bench, title: str, project: Path, rounds: int, edit: Callable[[], None], nbytes: int
) -> None:
    cases = b.cases(project)
    first: dict[str, list[float]] = {n: [] for n in cases}
    again: dict[str, list[float]] = {n: [] for n in cases}
    edited: dict[str, list[float]] = {n: [] for n in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            dest = b.fresh("d")
            first[name].append(timed(lambda fn=fn, dest=dest: fn(dest)))
            again[name].append(timed(lambda fn=fn, dest=dest: fn(dest)))
            edit()
            edited[name].append(timed(lambda fn=fn, dest=dest: fn(dest)))
            b.clear(dest)
    print(f"\n{title}")
    print(
        f"{'':38s} {'first s':>8s} {'x rsync':>8s} {'same s':>8s} {'x rsync':>8s}"
        f" {'edit s':>8s} {'x rsync':>8s}"
    )
    ref = "rsync -a -e ssh (by hand)"
    med = {
        k: {n: statistics.median(v) for n, v in d.items()}
        for k, d in (("first", first), ("same", again), ("edit", edited))
    }
    for name in cases:
        row = f"{name:38s}"
        for k in ("first", "same", "edit"):
            row += f" {med[k][name]:8.3f} {med[k][name] / med[k][ref]:8.2f}"
        print(row)
    rate = nbytes / med["first"][ref] / 1e6
    print(f"(first sync by plain rsync: {rate:.0f} MB/s)")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", default="200M")
    args = parser.parse_args()
    size = parse_size(args.size)

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm, have_root_netns

    if not have_root_netns():
        raise SystemExit("needs root: the test host is a network namespace (NetnsBed)")
    if shutil.which("rsync") is None:
        raise SystemExit("needs rsync")
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-sync-"))
    keys = ClientKeys.generate(work / "keys")
    try:
        with NetnsBed(work / "bed", keys) as bed:
            host = bed.add_host("bench")
            home = work / "home"
            (home / ".ssh").mkdir(parents=True, mode=0o700)
            known = home / ".ssh" / "known_hosts"
            known.write_text("".join(line + "\n" for line in host.known_hosts_lines()))
            (home / ".ssh" / "config").write_text(
                host.ssh_config_block(alias="bench", identity=keys.private)
                + f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n"
                "    BatchMode yes\n"
            )
            b = Bench(work, host, keys, home)
            ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
            rsync_v = subprocess.run(["rsync", "--version"], capture_output=True, text=True)
            print(
                f"vmrun sync benchmark: {args.rounds} interleaved rounds, medians;"
                f" NetnsBed host; {os.cpu_count()} CPUs; {ssh_v};"
                f" {rsync_v.stdout.splitlines()[0]}"
            )

            tree = work / "tree"
            for i in range(args.files):
                path = tree / f"pkg{i // 100:02d}" / f"mod{i:04d}.py"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(os.urandom(10240))
            counter = iter(range(10**6))

            def edit_tree() -> None:
                path = tree / "pkg00" / "mod0000.py"
                path.write_bytes(os.urandom(10240 + next(counter) % 7 + 1))

            scenario(
                b, f"{args.files} x 10 KiB tree", tree, args.rounds, edit_tree, args.files * 10240
            )

            big = work / "big"
            big.mkdir()
            blob = big / "data.bin"
            with open(blob, "wb") as fh:
                for _ in range(size >> 20):
                    fh.write(os.urandom(1 << 20))

            def edit_big() -> None:
                with open(blob, "r+b") as fh:
                    fh.seek(size // 2)
                    fh.write(os.urandom(1 << 20))

            scenario(b, f"one {size >> 20} MiB file", big, args.rounds, edit_big, size)
            b.conn.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
