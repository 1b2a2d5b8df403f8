"""Transfer speed: vmrun fetch against scp, rsync and the `ssh host cat` ceiling, side by side.

Starts its own test host (a NetnsBed host as root, else a LoopbackHost sshd on 127.0.0.1),
puts a random file (1 GiB by default) and a 2,000 x 10 KiB tree there, and times each tool
in interleaved rounds (so a busy machine slows all of them alike), printing medians and the
ratios the goals are stated in (issue 6):

- a large file: vmrun >= 1.0x scp with the same host settings, >= 0.8x `ssh cat`;
- the tree re-fetched with nothing new: vmrun <= 1.0x `rsync -a`.

Every tool gets the same host settings: one generated ssh_config (host, port, user, key,
known_hosts, StrictHostKeyChecking) used by ssh, scp and rsync, and by vmrun through
~/.ssh/config. "gcm" rows prefer aes128-gcm@openssh.com, as vmrun's engine does.

    sudo python benchmarks/transfer.py [--size 1G] [--rounds 5] [--files 2000] [--rtt MS]
        [--no-tree] [--busy N] [--vmrun DIR]

`--rtt MS` reaches the host through a relay here that holds each chunk MS/2 each way
(bench_common.delay_relay: this kernel has no netem), so SSH's windows and handshakes see
the RTT; `--busy N` spins N processes meanwhile; `--vmrun DIR` adds the CLI of another copy
of vmrun (`git archive COMMIT vmrun | tar -x -C DIR`) to the same rounds, an A/B.

The engine by path (vmrun.transfer.streams.choose_engine), measured on the test bed's hosts
(NetnsBed, 2 CPUs shared with other work; one fresh file, connect + list + SHA-256 + rename,
median of 3, seconds; paramiko / openssh engine):

                         4 MiB        16 MiB       32 MiB       50 MiB       128 MiB
    direct (h1)          0.25 / 0.53  0.32 / 0.69               0.58 / 1.11  1.36 / 1.35
    via a jump (hidden)  0.33 / 1.00  0.48 / 0.83  1.41 / 1.58  2.23 / 1.52

Through a jump host paramiko decrypts every byte twice in this process (the jump's
transport, then the host's) and falls behind from about 32 MiB; OpenSSH's own handshake
through the jump costs ~0.7 s. Hence OpenSSH from 32 MiB there, from 128 MiB direct.

At 20 ms RTT vmrun measured 1.5-2.0x scp where it had measured 2.3-2.4x. Nothing of vmrun
changed: the figure moves with the load of this 2-core machine. Measured with `--size 256M
--rounds 3 --rtt 20 --no-tree` (medians, s; speed against scp with aes128-gcm):

                                        quiet          1 process spinning
    scp (gcm)                           3.27           3.30 - 3.45
    vmrun engine, paramiko (forced)     0.97 (3.38x)   1.29 - 1.45 (2.39 - 2.56x)
    vmrun fetch CLI                     1.29 (2.54x)   1.63 - 2.22 (1.55 - 2.02x)
    CLI of 2135628 (first fetch), A/B   1.30 (2.51x)   1.59 (2.07x)

- The engine: at 20 ms the CLI picks paramiko (its 16 MiB window), whose rate is CPU-bound
  (Python and the cipher, ~280 MB/s here), while scp is window-bound (OpenSSH's 2 MiB per
  RTT, ~82 MB/s) and uses little CPU: any other work on the two cores slows vmrun alone.
  Interleaved in the same rounds, the CLI of the first fetch commit and today's are even.
- Start-up and connection (a 1-byte fetch): the CLI 0.44 s (0.50-0.53 s at 2135628), of
  which 0.18 s is Python's start-up and vmrun's imports (`fetch --help` alone: 0.08 s) and
  0.26 s the engine's connect, listing and checksums, about 13 round trips; `ssh true`
  0.35 s, scp 0.54 s. On the big file the CLI is 0.32 s behind the forced engine: that
  start-up, the RTT probe that picks the engine (3 round trips) and 0.08 s not broken down.

So compare vmrun and scp here only with the machine otherwise idle (the load average is
printed at the start; the relay's own CPU is shared by every row alike).
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

from bench_common import host_block, parse_size  # noqa: E402

GCM = "aes128-gcm@openssh.com"


class Bench:
    def __init__(self, work: Path, host: object, alias: str, other: Path | None = None):
        self.work = work
        self.host = host
        self.alias = alias
        self.home = work / "client-home"
        self.env = {**os.environ, "HOME": str(self.home), "PYTHONPATH": str(ROOT)}
        self.cli_env = {k: v for k, v in self.env.items() if k != "VMRUN_TRANSFER_ENGINE"}
        self.other = other  # --vmrun: another copy's CLI, in the same rounds (an A/B)
        self.env.pop("SSH_AUTH_SOCK", None)
        self.cfg = self.home / ".ssh" / "config"
        self.dest = work / "dest"

    def ssh(self, *extra: str) -> list[str]:
        return ["ssh", "-F", str(self.cfg), *extra]

    def run(self, argv: list[str], **kw: object) -> None:
        subprocess.run(argv, check=True, env=self.env, **kw)  # type: ignore[call-overload]

    def vmrun_engine(
        self, remote: str, engine: str = "auto", dest: Path | None = None
    ) -> Callable[[], None]:
        """vmrun's engine in-process: connect, list, compare, stream, verify, rename."""

        def go() -> None:
            from vmrun.config import load_settings
            from vmrun.ssh.connection import Connection
            from vmrun.transfer.download import download
            from vmrun.transfer.types import FetchSpec, Options

            settings = load_settings({}, environ=self.env)
            with Connection(self.alias, settings) as conn:
                spec = FetchSpec(remote, remote if dest is None else "")
                report = download(conn, [spec], dest or self.dest, Options(engine=engine))
            if report.failed or report.missing:
                raise SystemExit(f"vmrun fetch failed: {report}")

        return go

    def vmrun_cli(self, remote: str, root: Path = ROOT) -> Callable[[], None]:
        """The whole `vmrun fetch` process, as a user runs it: the engine it picks itself
        (`root`: the copy of vmrun it runs)."""
        # `~/`: a relative path would be under the project's work directory on the host
        argv = [sys.executable, "-m", "vmrun", "fetch", "-H", self.alias, f"~/{remote}", "--to"]
        env = {**self.cli_env, "PYTHONPATH": str(root)}

        def go() -> None:  # its per-file lines on stderr would break up the tables
            done = subprocess.run(
                [*argv, str(self.dest)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                cwd=self.work,
            )
            if done.returncode != 0:
                raise SystemExit(f"vmrun fetch failed ({done.returncode}): {done.stderr}")

        return go


def rounds(
    cases: dict[str, Callable[[], None]], n: int, before: Callable[[], None]
) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per case; the cases take turns, round after round."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(n):
        for name, fn in cases.items():
            before()
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: (statistics.median(ts), min(ts)) for name, ts in times.items()}


def table(
    title: str, results: dict[str, tuple[float, float]], nbytes: int, refs: dict[str, str]
) -> None:
    print(f"\n{title}")
    head = f"{'':34s} {'median s':>9s} {'min s':>7s} {'MB/s':>6s}"
    head += "".join(f" {'speed/' + r:>14s}" for r in refs)
    print(head)
    for name, (secs, best) in results.items():
        rate = f"{nbytes / secs / 1e6:6.0f}" if nbytes else f"{'':6s}"
        ratios = "".join(f" {results[ref][0] / secs:14.2f}" for ref in refs.values())
        print(f"{name:34s} {secs:9.3f} {best:7.3f} {rate}{ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="large file size (1G, 256M...)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=2000, help="files in the tree")
    parser.add_argument(
        "--rtt", type=float, default=0.0, help="ms of round-trip time to add (a delaying relay)"
    )
    parser.add_argument("--no-tree", action="store_true", help="skip the 10 KiB tree")
    parser.add_argument(
        "--busy", type=int, default=0, help="N processes spinning on the CPUs meanwhile"
    )
    parser.add_argument(
        "--vmrun",
        type=Path,
        default=None,
        help="also the CLI of this copy (`git archive COMMIT vmrun | tar -x -C DIR`), in the"
        " same rounds: an A/B",
    )
    args = parser.parse_args()
    size = parse_size(args.size)

    from testbed import ClientKeys, LoopbackHost, NetnsBed, cleanup_on_sigterm, have_root_netns

    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    keys = ClientKeys.generate(work / "keys")
    try:
        if have_root_netns():
            bed = NetnsBed(work / "bed", keys)
            host = bed.add_host("bench")
            kind = "NetnsBed host (own network namespace, veth + bridge)"

            closer: Callable[[], None] = bed.close
            data_root = host.home
        else:
            host = LoopbackHost(work, keys)
            kind = "LoopbackHost (sshd on 127.0.0.1)"
            closer = host.close
            data_root = host.home
        try:
            bench_body(work, host, keys, kind, size, args, data_root)
        finally:
            closer()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_body(
    work: Path,
    host,
    keys,
    kind: str,
    size: int,
    args,
    data_root: Path,
) -> None:
    b = Bench(work, host, "bench", args.vmrun.resolve() if args.vmrun else None)
    (b.home / ".ssh").mkdir(parents=True, mode=0o700)
    known = b.home / ".ssh" / "known_hosts"
    block, names, _relay = host_block(host, keys.private, args.rtt)
    known.write_text("".join(line + "\n" for line in host.known_hosts_lines(names)))
    b.cfg.write_text(
        block + f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
    )
    sub = f"vmrun-bench-{os.getpid()}"
    big, tree, tiny = f"{sub}/big.bin", f"{sub}/tree", f"{sub}/tiny.bin"
    files = 0 if args.no_tree else args.files
    script = (
        f"mkdir -p {tree} && head -c 1 /dev/urandom > {tiny} &&"
        f" head -c {size} /dev/urandom > {big} && cd {tree} &&"
        f" i=0; while [ $i -lt {files} ]; do head -c 10240 /dev/urandom > f$i;"
        " i=$((i+1)); done"
    )
    host.run(["sh", "-c", script], as_user=True, timeout=600)
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        header(kind, size, args)
        spin = [sys.executable, "-c", "while True: pass"]
        spinners += [subprocess.Popen(spin) for _ in range(args.busy)]
        fixed_costs(b, tiny, args.rounds)
        large(b, big, size, args.rounds)
        hash_budget(b, host, big, size)
        if not args.no_tree:
            small(b, tree, args)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
        host.run(["rm", "-rf", sub], as_user=True, timeout=120)


def header(kind: str, size: int, args: argparse.Namespace) -> None:
    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    if args.rtt:
        kind += f", reached through a relay adding {args.rtt:g} ms RTT"
    print(f"vmrun transfer benchmark: {size / 2**30:.2f} GiB file, {args.files}-file tree,")
    print(f"  {args.rounds} interleaved rounds, medians; host: {kind}; {ssh_v}")
    print(f"  {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}", end="")
    print(f"; {args.busy} process(es) spinning meanwhile" if args.busy else "")


def fixed_costs(b: Bench, tiny: str, n: int) -> None:
    """What a fetch costs before its bytes: a 1-byte file. The engine in this process is
    connect + listing + checksums; the CLI adds Python's start-up and vmrun's imports; `vmrun
    fetch --help` is start-up and imports alone; `ssh true` is OpenSSH's connect alone."""
    out = b.dest / tiny
    out.parent.mkdir(parents=True, exist_ok=True)
    help_argv = [sys.executable, "-m", "vmrun", "fetch", "--help"]
    cases: dict[str, Callable[[], None]] = {
        "ssh true (connect only)": lambda: b.run([*b.ssh(), "bench", "true"]),
        "scp 1 byte": lambda: b.run(["scp", "-q", "-F", str(b.cfg), f"bench:{tiny}", str(out)]),
        "vmrun fetch --help (start-up)": lambda: b.run(help_argv, stdout=subprocess.DEVNULL),
        "vmrun fetch engine, 1 byte": b.vmrun_engine(tiny),
        "vmrun fetch CLI, 1 byte": b.vmrun_cli(tiny),
    }
    if b.other:
        cases[f"... CLI of {b.other.name}, 1 byte"] = b.vmrun_cli(tiny, b.other)
    results = rounds(cases, n, lambda: out.unlink(missing_ok=True))
    table("fixed costs: a 1-byte file (time to the first byte and back)", results, 0, {})


def large(b: Bench, big: str, size: int, n: int) -> None:
    out = b.dest / big
    out.parent.mkdir(parents=True, exist_ok=True)
    gcm = ["-c", GCM]
    cases: dict[str, Callable[[], None]] = {
        "ssh cat (gcm) = ceiling": lambda: b.run(
            [*b.ssh(*gcm), "bench", f"cat {big}"], stdout=out.open("wb")
        ),
        "scp (default cipher)": lambda: b.run(
            ["scp", "-q", "-F", str(b.cfg), f"bench:{big}", str(out)]
        ),
        "scp (gcm, same settings as vmrun)": lambda: b.run(
            ["scp", "-q", "-F", str(b.cfg), *gcm, f"bench:{big}", str(out)]
        ),
        "scp -O legacy protocol (gcm)": lambda: b.run(
            ["scp", "-O", "-q", "-F", str(b.cfg), *gcm, f"bench:{big}", str(out)]
        ),
        "rsync (gcm)": lambda: b.run(
            ["rsync", "-a", "-e", " ".join(b.ssh(*gcm)), f"bench:{big}", str(out)]
        ),
        "vmrun fetch (openssh engine)": b.vmrun_engine(big, "openssh"),
        "vmrun fetch (paramiko engine)": b.vmrun_engine(big, "paramiko"),
        "vmrun fetch CLI (default engine)": b.vmrun_cli(big),  # lands where `out` is
    }
    if b.other:
        cases[f"... CLI of {b.other.name}"] = b.vmrun_cli(big, b.other)

    def clear() -> None:
        out.unlink(missing_ok=True)

    results = rounds(cases, n, clear)
    medians = {name: med for name, (med, _) in results.items()}
    table(
        f"large file ({size / 2**20:.0f} MiB), fresh copy each time; vmrun includes connect,"
        " listing, SHA-256 on both ends, rename (CLI: the whole `vmrun fetch` process too)",
        results,
        size,
        {"ceiling": "ssh cat (gcm) = ceiling", "scp(gcm)": "scp (gcm, same settings as vmrun)"},
    )
    scp = medians["scp (gcm, same settings as vmrun)"]
    ceiling = medians["ssh cat (gcm) = ceiling"]
    vm = medians["vmrun fetch (openssh engine)"]
    verdict("large file, speed vs scp (same settings)", scp / vm, 1.0, ">=")
    verdict("large file, speed vs scp (default)", medians["scp (default cipher)"] / vm, 1.0, ">=")
    verdict("large file, speed vs ssh cat ceiling", ceiling / vm, 0.8, ">=")
    cli = medians["vmrun fetch CLI (default engine)"]
    verdict("large file, `vmrun fetch` CLI speed vs scp (same settings)", scp / cli, 1.0, ">=")
    verdict(
        "large file, `vmrun fetch` CLI speed vs scp (default)",
        medians["scp (default cipher)"] / cli,
        1.0,
        ">=",
    )
    verdict("large file, `vmrun fetch` CLI speed vs ssh cat ceiling", ceiling / cli, 0.8, ">=")


def small(b: Bench, tree: str, args: argparse.Namespace) -> None:
    copies = iter(range(1_000_000))

    def rsync_to_new() -> None:  # a new folder each time: no deletes between runs
        b.run(["rsync", "-a", "-e", " ".join(b.ssh()), f"bench:{tree}/", f"{next_dir()}/"])

    def vmrun_to_new() -> None:
        b.vmrun_engine(tree, dest=next_dir())()

    def next_dir() -> Path:
        (b.work / "copies").mkdir(exist_ok=True)
        return b.work / "copies" / str(next(copies))

    first = rounds(
        {"rsync -a": rsync_to_new, "vmrun fetch (engine)": vmrun_to_new},
        args.rounds,
        lambda: None,
    )
    table(
        f"{args.files} x 10 KiB tree, first copy", first, args.files * 10240, {"rsync": "rsync -a"}
    )
    rs_dest = b.work / "rsync-dest"
    rs_dest.mkdir()
    rsync = ["rsync", "-a", "-e", " ".join(b.ssh()), f"bench:{tree}/", f"{rs_dest}/"]
    b.run(rsync)
    b.vmrun_engine(tree)()
    again = rounds(
        {
            "rsync -a (nothing new)": lambda: b.run(rsync),
            "vmrun fetch engine (nothing new)": b.vmrun_engine(tree),
            "vmrun fetch CLI (nothing new)": b.vmrun_cli(tree),
        },
        args.rounds,
        lambda: None,
    )
    table(
        f"{args.files}-file tree re-fetched, nothing new (engine: fresh connection + listing +"
        " compare; CLI: the whole `vmrun fetch` process)",
        again,
        0,
        {"rsync": "rsync -a (nothing new)"},
    )
    rs = again["rsync -a (nothing new)"][0]
    engine = again["vmrun fetch engine (nothing new)"][0]
    cli = again["vmrun fetch CLI (nothing new)"][0]
    verdict("no-change re-fetch, time vs rsync -a (engine)", engine / rs, 1.0, "<=")
    verdict("no-change re-fetch, time vs rsync -a (whole CLI)", cli / rs, 1.0, "<=")


def hash_budget(b: Bench, host: object, big: str, size: int) -> None:
    """What the SHA-256 on both ends costs here: on a loopback test host both ends share
    these CPUs with the ssh processes; on a real host each end has its own."""
    from vmrun.transfer.hashing import file_sha256

    b.vmrun_engine(big)()
    started = time.perf_counter()
    host.run(["openssl", "dgst", "-sha256", big], as_user=True, timeout=300)  # type: ignore[attr-defined]
    remote = time.perf_counter() - started
    started = time.perf_counter()
    file_sha256(b.dest / big)
    local = time.perf_counter() - started
    print(
        f"SHA-256 of {size / 2**20:.0f} MiB: host (openssl) {remote:.2f} s, here (hashlib)"
        f" {local:.2f} s: {remote + local:.2f} CPU-seconds vmrun spends that scp does not"
    )


def verdict(what: str, ratio: float, goal: float, op: str) -> None:
    ok = ratio >= goal if op == ">=" else ratio <= goal
    print(f"goal: {what}: {ratio:.2f}x (goal {op} {goal:.1f}x) {'MET' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
