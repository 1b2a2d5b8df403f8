"""Push speed: `vmrun push` against scp and `rsync -a`, side by side (issue 24's goals).

Starts its own test host (a NetnsBed host as root, else a LoopbackHost sshd on 127.0.0.1),
makes the data here (a random file, 1 GiB by default; a tree of 100,000 x 4 KiB files in
folders of 1,000) and times each tool pushing it there in interleaved rounds (so a busy
machine slows all of them alike), printing medians, the ratios the goals are stated in, and
how many of the CPUs were busy meanwhile (both ends and the relay share them here):

- the large file: vmrun >= 1.0x scp on loopback, >= 3x at 20 ms RTT, >= 5x at 80 ms;
- the tree, first push at 20 ms: vmrun >= 2x `rsync -a` (and far ahead of `scp -r`);
- the tree re-pushed with nothing to send: vmrun <= 1.0x `rsync -a`;
- `--fan RATE`: the large file to 4 (`--fan-hosts N`) hosts with this machine's link limited
  to RATE (tc tbf on the bed's veth from here; nothing between the hosts): <= 1.3x the time
  to one host.

Every tool gets the same host settings: one generated ssh_config (host, port, user, key,
known_hosts) used by ssh, scp and rsync, and by vmrun through ~/.ssh/config. "gcm" rows
ask for aes128-gcm@openssh.com, as vmrun's engine does. vmrun rows are the whole `vmrun
push` process (start-up, connect, listing, free-space check, SHA-256 on both ends, rename)
and, for the large file, vmrun's upload in this process with each engine forced.

    sudo python benchmarks/push.py [--size 1G] [--rounds 3] [--files 100000] [--rtt MS]
        [--no-big] [--no-tree] [--no-scp-tree] [--fan RATE] [--vmrun DIR [--skip-tree-cli]]

`--rtt MS` reaches the host through a relay here that holds each chunk MS/2 each way
(bench_common.delay_relay: this kernel has no netem). The fan-out (`--fan-hosts N`: 2-4
hosts) runs without the relay; its third row pushes the same bytes as a folder with no
setting (the hosts reach each other at the addresses vmrun dials), its fourth with the
hosts' private_addr in vmrun.toml: both cross this machine's limited link once and go host
to host. 256 MiB to 3 hosts at 200mbit, 2 rounds: 1 host 11.96 s, 3 from here 34.51 s,
host to host 14.51 s (1.21x), with private_addr 14.45 s (1.21x).
256 MiB at 80 ms, 3 rounds: scp 12.35 s, vmrun push (CLI) 3.65 s (3.38x; 2.66x before its
streams started during the check, took ranges from a shared queue and placed the file
without a round trip after the data), vmrun fetch 3.69 s (3.34x), 4 x ssh cat 3.83 s.
`--vmrun DIR` adds the CLI of another copy of vmrun to the same rounds (an A/B: a commit via
`git archive COMMIT vmrun | tar -x -C DIR`, or a patched copy); `--skip-tree-cli` leaves
this checkout's CLI out of the tree's first push.

Measured at 118c006 and the commits just before it on the test bed (NetnsBed host, OpenSSH
9.2, 2 CPUs that both ends, the relay and this script share; one round each; s; speed = the
other tool's time / vmrun's; "cores": CPUs busy of 2). vmrun push is the whole CLI
process; fetch is vmrun's download in this process (`vmrun fetch` takes a run's outputs,
not any path).

    1 GiB file                  loopback            20 ms              80 ms
    scp (default cipher)        3.46                11.83   91 MB/s    44.83   24 MB/s
    scp (gcm)                   2.34                11.69              44.47
    rsync -a                    4.04                11.77              44.53
    vmrun push (CLI)            3.48  0.99x scp     5.63  2.10x        8.57  5.23x (goal 5x)
    ... library, openssh        3.26                5.16  (4 streams)  7.58  (8 streams)
    4 x ssh cat, no checksum    2.42                3.57  3.31x        11.72 3.83x
    cores busy (vmrun push)     1.55                1.60               1.11
    fetch: scp / vmrun          4.73 / 2.86  1.65x  11.96 / 5.43 2.20x 44.27 / 8.01  5.53x

- 80 ms: both goals met (push 5.2x, fetch 5.5x scp): eight OpenSSH connections, each with
  its own 2 MiB window, where every single-channel tool moves 2 MiB per round trip.
- 20 ms: 2.1-2.2x (goal 3x). CPU-bound: four streams carry 352 MB/s of windows, the two
  shared cores do ~200 MB/s with SHA-256 on both ends; four plain `ssh cat` of ranges,
  nothing verified, reach 3.3x.
- Loopback: 0.99x scp with its default cipher, 0.67x scp with aes128-gcm; both ends hash
  every byte (SHA-NI, 1.7 GB/s here) on the same two cores.

    100,000 x 4 KiB tree, 20 ms           rsync -a     vmrun push
    first push into an empty folder       9.58         9.82   (0.98x; goal 2x)
    re-push, nothing changed              3.03         2.29   (0.75x the time; goal <= 1x)

- First push: one record stream per folder run (four at once at 20 ms), each file hashed,
  written, timed and renamed by the host as it arrives; creating 100,000 files on the
  host's ext4 bounds both tools (the receiver alone: 2.4 s on tmpfs, 8-50 s on this busy
  disk). Earlier: 27.1 s (0.42x), 15.4 s with records, 11.3 s with one walk of the tree.
- Nothing changed: one os.scandir walk shared by the plan and the upload, one listing.

    --fan 400mbit, 256 MiB        1 host 6.21 s   4 hosts from here 23.26 s (3.75x)
    4 hosts, once over the link, then host to host: 9.84-10.1 s (1.55-1.62x; goal 1.3x)
    traced: the nearest host from here 5.84 s, one hop 1.16 s, then two hops at once
    2.13 s each (CPU-bound: four hosts and this machine share the two cores), start-up,
    checks and round-trip measurement 0.7 s.

push is a star from here without private addresses: each host's copy crosses the limited
link (tc tbf on the bed's veth from the root namespace; the hosts' bridge unlimited).
"""

from __future__ import annotations

import argparse
import json
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

from bench_common import host_block, parse_size  # noqa: E402

GCM = "aes128-gcm@openssh.com"
Result = tuple[float, float, float]  # median s, min s, median CPUs busy


def cpu_busy() -> tuple[float, float]:
    """(busy, all) CPU-seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / hz, sum(fields) / hz


class Bench:
    def __init__(self, work: Path, host: object, other: Path | None = None):
        self.work = work
        self.other = other  # --vmrun: another copy's CLI, in the same rounds (an A/B)
        self.profile: Path | None = None  # --profile PATH: cProfile output, PATH.1, PATH.2...
        self.profiled = 0
        self.host = host
        self.alias = "bench"
        self.home = work / "client-home"
        self.env = {**os.environ, "HOME": str(self.home), "PYTHONPATH": str(ROOT)}
        self.env.pop("SSH_AUTH_SOCK", None)
        self.env.pop("VMRUN_HOSTS", None)
        self.cfg = self.home / ".ssh" / "config"
        self.project = work / "project"  # vmrun runs here: no vmrun.toml
        self.project.mkdir()

    def ssh(self, *extra: str) -> list[str]:
        return ["ssh", "-F", str(self.cfg), *extra]

    def run(self, argv: list[str], root: Path = ROOT) -> Callable[[], None]:
        env = {**self.env, "PYTHONPATH": str(root)}

        def go() -> None:
            done = subprocess.run(
                argv,
                env=env,
                cwd=self.project,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            if done.returncode != 0:
                raise SystemExit(f"{argv[0]} failed ({done.returncode}): {done.stderr[-2000:]}")

        return go

    def scp(self, src: Path, dest: str, *extra: str) -> Callable[[], None]:
        return self.run(
            ["scp", "-q", "-F", str(self.cfg), *extra, str(src), f"{self.alias}:{dest}/"]
        )

    def rsync(self, src: Path, dest: str, *extra: str) -> Callable[[], None]:
        ssh = " ".join(self.ssh(*extra))
        return self.run(["rsync", "-a", "-e", ssh, str(src), f"{self.alias}:{dest}/"])

    def vmrun_cli(
        self,
        src: Path,
        dest: str,
        hosts: list[str] | None = None,
        root: Path = ROOT,
        extra: tuple[str, ...] = (),
    ) -> Callable[[], None]:
        """The whole `vmrun push` process, as a user runs it (the engine it picks itself);
        `root`: the copy of vmrun it runs."""
        flags = [w for h in hosts or [self.alias] for w in ("-H", h)]
        python = [sys.executable]
        if self.profile is not None and root == ROOT:  # --profile: where this CLI's time goes
            self.profiled += 1
            python += ["-m", "cProfile", "-o", f"{self.profile}.{self.profiled}"]
        return self.run(
            [*python, "-m", "vmrun", "push", str(src), "--to", f"~/{dest}", *flags, *extra], root
        )

    def vmrun_engine(self, src: Path, dest: str, engine: str) -> Callable[[], None]:
        """vmrun's upload in this process with `engine` forced: connect, list, stream,
        verify, rename (what the CLI does after its start-up and checks)."""

        def go() -> None:
            from vmrun.config import load_settings
            from vmrun.ssh.connection import Connection
            from vmrun.transfer.types import Options
            from vmrun.transfer.upload import upload

            settings = load_settings({}, environ=self.env)
            with Connection(self.alias, settings) as conn:
                report = upload(conn, src, f"{dest}/{src.name}", Options(engine=engine))
            if report.failed:
                raise SystemExit(f"vmrun upload failed: {report.failed}")

        return go

    def ssh_ranges(self, src: Path, dest: str, n: int) -> Callable[[], None]:
        """`n` ssh connections at once, each carrying 1/n of the file (`dd` ranges, gcm): what
        parallel channels could reach, no checksum, no reassembly."""
        size = src.stat().st_size
        mib = -(-size // n // (1 << 20))  # per range, whole MiB
        ssh = " ".join(self.ssh("-c", GCM))
        script = " & ".join(
            f"dd if={src} bs=1M skip={i * mib} count={mib} status=none"
            f" | {ssh} {self.alias} 'cat > {dest}/part{i}'"
            for i in range(n)
        )
        return self.run(["sh", "-c", script + " & wait"])

    def clear(self, *dests: str) -> Callable[[], None]:
        """Empty the remote folders (outside the timing)."""
        script = "".join(f"rm -rf {d} && mkdir -p {d} && " for d in dests) + "true"

        def go() -> None:
            self.host.run(["sh", "-c", script], as_user=True, timeout=600)  # type: ignore[attr-defined]

        return go


def rounds(
    cases: dict[str, Callable[[], None]], n: int, before: Callable[[], None]
) -> dict[str, Result]:
    """(median, min, CPUs busy) per case; the cases take turns, round after round."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    busy: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(n):
        for name, fn in cases.items():
            before()
            cpu0, started = cpu_busy()[0], time.perf_counter()
            fn()
            wall = time.perf_counter() - started
            times[name].append(wall)
            busy[name].append((cpu_busy()[0] - cpu0) / wall)
            print(f"  {name}: {wall:.2f} s", file=sys.stderr, flush=True)
    return {
        name: (statistics.median(ts), min(ts), statistics.median(busy[name]))
        for name, ts in times.items()
    }


def table(title: str, results: dict[str, Result], nbytes: int, refs: dict[str, str]) -> None:
    print(f"\n{title}")
    head = f"{'':36s} {'median s':>9s} {'min s':>7s} {'MB/s':>6s} {'cores':>5s}"
    head += "".join(f" {'speed/' + r:>13s}" for r in refs)
    print(head)
    for name, (secs, best, cores) in results.items():
        rate = f"{nbytes / secs / 1e6:6.0f}" if nbytes else f"{'':6s}"
        ratios = "".join(f" {results[ref][0] / secs:13.2f}" for ref in refs.values())
        print(f"{name:36s} {secs:9.3f} {best:7.3f} {rate} {cores:5.2f}{ratios}")


def verdict(what: str, ratio: float, goal: float, op: str) -> None:
    ok = ratio >= goal if op == ">=" else ratio <= goal
    print(f"goal: {what}: {ratio:.2f}x (goal {op} {goal:.1f}x) {'MET' if ok else 'MISSED'}")


def make_file(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        left = size
        while left:
            block = os.urandom(min(left, 16 << 20))
            fh.write(block)
            left -= len(block)


def make_tree(root: Path, files: int, size: int = 4096) -> None:
    for i in range(files):
        folder = root / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"f{i:06d}").write_bytes(os.urandom(size))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", default="1G", help="large file size (1G, 256M...)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=100_000, help="4 KiB files in the tree")
    parser.add_argument("--rtt", type=float, default=0.0, help="ms of RTT to add (a relay)")
    parser.add_argument("--no-big", action="store_true", help="skip the large file")
    parser.add_argument("--no-tree", action="store_true", help="skip the tree")
    parser.add_argument("--no-scp-tree", action="store_true", help="no `scp -r` of the tree")
    parser.add_argument(
        "--skip-tree-cli",
        action="store_true",
        help="leave this checkout's CLI out of the"
        " tree's first push (with --vmrun DIR: a copy without its quadratic step)",
    )
    parser.add_argument(
        "--fan",
        default=None,
        metavar="RATE",
        help="also 1 vs 4 hosts, this link at RATE (tc tbf syntax: 400mbit)",
    )
    parser.add_argument(
        "--fan-hosts",
        type=int,
        default=4,
        choices=(2, 3, 4),
        help="how many hosts the fan-out sends to",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write cProfile data of this checkout's"
        " CLI runs to PATH.1, PATH.2... (`python -m pstats PATH.1`)",
    )
    parser.add_argument(
        "--vmrun",
        type=Path,
        default=None,
        help="also the CLI of this copy of vmrun"
        " (`git archive COMMIT vmrun | tar -x -C DIR`, or a patched one), in the same rounds",
    )
    args = parser.parse_args()
    size = parse_size(args.size)

    from testbed import ClientKeys, LoopbackHost, NetnsBed, cleanup_on_sigterm, have_root_netns

    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-pushbench-"))
    keys = ClientKeys.generate(work / "keys")
    bed = None
    try:
        if have_root_netns():
            bed = NetnsBed(work / "bed", keys)
            host = bed.add_host("bench")
            kind = "NetnsBed host (own network namespace, veth + bridge)"
            closer: Callable[[], None] = bed.close
        else:
            host = LoopbackHost(work, keys)
            kind = "LoopbackHost (sshd on 127.0.0.1)"
            closer = host.close
        try:
            body(work, bed, host, keys, kind, size, args)
        finally:
            closer()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def body(work: Path, bed, host, keys, kind: str, size: int, args) -> None:  # type: ignore[no-untyped-def]
    b = Bench(work, host, args.vmrun.resolve() if args.vmrun else None)
    b.profile = args.profile.resolve() if args.profile else None
    (b.home / ".ssh").mkdir(parents=True, mode=0o700)
    known = b.home / ".ssh" / "known_hosts"
    block, names, relay = host_block(host, keys.private, args.rtt)
    lines = host.known_hosts_lines(names)
    if bed is not None and args.fan:
        others = [bed.add_host(f"h{i}") for i in (2, 3, 4)]
        block += host.ssh_config_block(alias="h1", identity=keys.private)
        block += "".join(h.ssh_config_block(identity=keys.private) for h in others)
        lines += [ln for h in others for ln in h.known_hosts_lines()]
        if args.rtt:
            lines += host.known_hosts_lines()
    known.write_text("".join(line + "\n" for line in lines))
    b.cfg.write_text(
        block + "Host *\n"
        f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
    )
    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    if args.rtt:
        kind += f", reached through a relay adding {args.rtt:g} ms RTT"
    print(f"vmrun push benchmark: {size / 2**30:.2f} GiB file, {args.files} x 4 KiB tree,")
    print(f"  {args.rounds} interleaved rounds, medians; host: {kind}; {ssh_v}")
    print(f"  {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}")
    try:
        if not args.no_big:
            big = work / "data" / "big.bin"
            big.parent.mkdir()
            make_file(big, size)
            large(b, big, size, args)
            large_fetch(b, big, size, args)
        if not args.no_tree:
            tree = work / "tree-data" / "tree"
            started = time.perf_counter()
            make_tree(tree, args.files)
            print(
                f"\n(made the {args.files}-file tree here in {time.perf_counter() - started:.1f} s)"
            )
            small(b, tree, args)
        if args.fan:
            if bed is None:
                print("\nfan-out skipped: no network namespaces (needs root): no link to limit")
            else:
                fan(b, bed, work / "data" / "big.bin", size, args)
    finally:
        host.run(["rm", "-rf", "pb"], as_user=True, timeout=600)
        if relay is not None:
            relay.terminate()  # type: ignore[attr-defined]


def _goal(rtt: float, size: int) -> float:
    """The speed over scp each goal asks: loopback 1x; 20 ms 3x; 80 ms 5x for 1 GiB, 3x for
    a smaller file (256 MiB: start-up and checks weigh more against scp's 11 s)."""
    if not rtt:
        return 1.0
    return 5.0 if rtt > 20 and size >= 1 << 30 else 3.0


def large(b: Bench, big: Path, size: int, args: argparse.Namespace) -> None:
    d = "pb/big"
    gcm = ["-c", GCM]
    cases = {
        "scp (default cipher)": b.scp(big, d),
        "scp (gcm)": b.scp(big, d, *gcm),
        "rsync -a": b.rsync(big, d),
        "vmrun push (CLI)": b.vmrun_cli(big, d),
        "vmrun upload, openssh engine": b.vmrun_engine(big, d, "openssh"),
        "vmrun upload, paramiko engine": b.vmrun_engine(big, d, "paramiko"),
        "4 x ssh cat at once (ranges, gcm)": b.ssh_ranges(big, d, 4),
    }
    if b.other:
        cases[f"... CLI of {b.other.name}"] = b.vmrun_cli(big, d, root=b.other)
    results = rounds(cases, args.rounds, b.clear(d))
    table(
        f"large file ({size / 2**20:.0f} MiB), pushed into an empty folder each time",
        results,
        size,
        {"scp": "scp (default cipher)", "scp(gcm)": "scp (gcm)", "rsync": "rsync -a"},
    )
    goal = _goal(args.rtt, size)
    cli = results["vmrun push (CLI)"][0]
    where = f"{args.rtt:g} ms RTT" if args.rtt else "loopback"
    verdict(
        f"large file at {where}, vmrun push vs scp",
        results["scp (default cipher)"][0] / cli,
        goal,
        ">=",
    )
    verdict(
        f"large file at {where}, vmrun push vs scp (gcm)", results["scp (gcm)"][0] / cli, goal, ">="
    )
    verdict(
        f"large file at {where}, vmrun push vs rsync -a", results["rsync -a"][0] / cli, goal, ">="
    )


def large_fetch(b: Bench, big: Path, size: int, args: argparse.Namespace) -> None:
    """The same file back: scp from the host against vmrun's download (its library call, in
    this process: `vmrun fetch` takes a run's outputs, not any path)."""
    b.run(["ssh", "-F", str(b.cfg), b.alias, "mkdir -p pb/src"])()
    b.scp(big, "pb/src")()
    here = b.work / "fetched"

    def clear() -> None:
        shutil.rmtree(here, ignore_errors=True)
        here.mkdir()

    def vmrun_fetch() -> None:
        from vmrun.config import load_settings
        from vmrun.ssh.connection import Connection
        from vmrun.transfer.download import download
        from vmrun.transfer.types import FetchSpec, Options

        settings = load_settings({}, environ=b.env)
        with Connection(b.alias, settings) as conn:
            report = download(conn, [FetchSpec("pb/src/big.bin", "big.bin")], here, Options())
        if report.failed or not report.fetched:
            raise SystemExit(f"vmrun download failed: {report.failed}")

    remote = f"{b.alias}:pb/src/{big.name}"
    cases = {
        "scp (default cipher)": b.run(["scp", "-q", "-F", str(b.cfg), remote, str(here)]),
        "scp (gcm)": b.run(["scp", "-q", "-F", str(b.cfg), "-c", GCM, remote, str(here)]),
        "vmrun download (library)": vmrun_fetch,
    }
    results = rounds(cases, args.rounds, clear)
    table(
        f"large file ({size / 2**20:.0f} MiB), fetched into an empty folder each time",
        results,
        size,
        {"scp": "scp (default cipher)", "scp(gcm)": "scp (gcm)"},
    )
    goal = _goal(args.rtt, size)
    where = f"{args.rtt:g} ms RTT" if args.rtt else "loopback"
    ours = results["vmrun download (library)"][0]
    verdict(
        f"large file at {where}, vmrun fetch vs scp",
        results["scp (default cipher)"][0] / ours,
        goal,
        ">=",
    )


def small(b: Bench, tree: Path, args: argparse.Namespace) -> None:
    d = "pb/tree"
    cases = {"rsync -a": b.rsync(tree, d)}
    if not args.skip_tree_cli:
        cases["vmrun push (CLI)"] = b.vmrun_cli(tree, d)
    if b.other:
        cases[f"... CLI of {b.other.name}"] = b.vmrun_cli(tree, d, root=b.other)
    if not args.no_scp_tree:
        cases["scp -r"] = b.run(["scp", "-q", "-r", "-F", str(b.cfg), str(tree), f"bench:{d}/"])
    first = rounds(cases, args.rounds, b.clear(d))
    table(
        f"{args.files} x 4 KiB tree, first push into an empty folder",
        first,
        args.files * 4096,
        {"rsync": "rsync -a"},
    )
    mine = [name for name in first if "CLI" in name]
    for name in mine:
        verdict(
            f"tree first push, {name} vs rsync -a", first["rsync -a"][0] / first[name][0], 2.0, ">="
        )
    rs, vm = "pb/again-rsync", "pb/again-vmrun"
    b.clear(rs, vm)()
    b.rsync(tree, rs)()
    b.vmrun_cli(tree, vm, root=b.other if args.skip_tree_cli and b.other else ROOT)()
    cases = {
        "rsync -a (nothing to send)": b.rsync(tree, rs),
        "vmrun push (nothing to send)": b.vmrun_cli(tree, vm),
    }
    if b.other:
        cases[f"... CLI of {b.other.name} (nothing to send)"] = b.vmrun_cli(tree, vm, root=b.other)
    again = rounds(cases, args.rounds, lambda: None)
    table(
        f"{args.files}-file tree re-pushed, nothing changed",
        again,
        0,
        {"rsync": "rsync -a (nothing to send)"},
    )
    for name in list(again)[1:]:
        verdict(
            f"no-change re-push, {name}, time vs rsync -a",
            again[name][0] / again["rsync -a (nothing to send)"][0],
            1.0,
            "<=",
        )


def fan(b: Bench, bed: object, big: Path, size: int, args: argparse.Namespace) -> None:
    """One host against four, this machine's link (the bed's veth from the root namespace)
    limited by a token bucket; the hosts reach each other on the bed's bridge, unlimited."""
    if not big.exists():
        big.parent.mkdir(exist_ok=True)
        make_file(big, size)
    link = bed.root_link  # type: ignore[attr-defined]
    limit = [
        "tc",
        "qdisc",
        "add",
        "dev",
        link,
        "root",
        "tbf",
        "rate",
        args.fan,
        "burst",
        "256k",
        "latency",
        "200ms",
    ]
    done = subprocess.run(limit, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"\nfan-out skipped: `tc ... tbf` failed here: {done.stderr.strip()}")
        return
    d = "pb/fan"
    hosts = ["h1", "h2", "h3", "h4"][: args.fan_hosts]
    n = len(hosts)
    # host to host: the same bytes as a folder; with no setting (each host reached at the
    # address vmrun dials, its ssh config's), and with the hosts' bed addresses as
    # private_addr (their bridge is not limited, only this machine's link is)
    folder = big.parent / "bigdir"
    folder.mkdir(exist_ok=True)
    if not (folder / big.name).exists():
        os.link(big, folder / big.name)
    addrs = {h.name: h.addr for h in bed.hosts()}  # type: ignore[attr-defined]
    addrs["h1"] = b.host.addr  # type: ignore[attr-defined]  # the benchmark's own host
    private = "".join(f'[[hosts]]\naddress = "{h}"\nprivate_addr = "{addrs[h]}"\n\n' for h in hosts)
    toml = b.project / "vmrun.toml"

    def clear_all() -> None:
        for h in bed.hosts():  # type: ignore[attr-defined]
            h.run(["sh", "-c", f"rm -rf {d} && mkdir -p {d}"], as_user=True, timeout=600)

    def with_toml(text: str, push: Callable[[], None]) -> Callable[[], None]:
        def go() -> None:
            toml.write_text(text)
            try:
                push()
            finally:
                toml.unlink(missing_ok=True)

        return go

    try:
        clear_all()
        started = time.perf_counter()
        traced = subprocess.run(
            [
                sys.executable,
                "-m",
                "vmrun",
                "push",
                str(folder),
                "--to",
                f"~/{d}",
                *[w for h in hosts for w in ("-H", h)],
                "--json",
            ],
            env=b.env,
            cwd=b.project,
            capture_output=True,
            text=True,
        )
        whole = time.perf_counter() - started
        if traced.returncode == 0:  # where the time goes: each hop's start and end
            print(f"\nhost to host, no setting, traced: {whole:.2f} s in all")
            for item in json.loads(traced.stdout)["hosts"]:
                print(
                    f"  {item['host']}: from {item['via'] or 'here'},"
                    f" {item.get('began_s')} s to {item.get('ended_s')} s"
                )
        else:
            print(f"\nhost to host, traced: failed: {traced.stderr.strip()[-300:]}")
        results = rounds(
            {
                "vmrun push, 1 host": b.vmrun_cli(big, d, hosts[:1], extra=("--no-relay",)),
                f"vmrun push, {n} hosts": b.vmrun_cli(big, d, hosts, extra=("--no-relay",)),
                f"vmrun push, {n} hosts, host to host": b.vmrun_cli(folder, d, hosts),
                f"vmrun push, {n} hosts, host to host, private_addr": with_toml(
                    private, b.vmrun_cli(folder, d, hosts)
                ),
            },
            args.rounds,
            clear_all,
        )
    finally:
        toml.unlink(missing_ok=True)
        subprocess.run(["tc", "qdisc", "del", "dev", link, "root"], check=False)
        for h in bed.hosts():  # type: ignore[attr-defined]
            h.run(["rm", "-rf", "pb"], as_user=True, timeout=600)
    table(
        f"large file ({size / 2**20:.0f} MiB) to 1 and to {n} hosts, this link at {args.fan}"
        " (MB/s: per host)",
        results,
        size,
        {},
    )
    one = results["vmrun push, 1 host"][0]
    verdict(f"{n} hosts, time vs 1 host", results[f"vmrun push, {n} hosts"][0] / one, 1.3, "<=")
    for row in (f"{n} hosts, host to host", f"{n} hosts, host to host, private_addr"):
        verdict(f"{row}, time vs 1 host", results[f"vmrun push, {row}"][0] / one, 1.3, "<=")


if __name__ == "__main__":
    main()
