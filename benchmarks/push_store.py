"""Data from a bucket to several hosts (issue 40): `vmrun push s3://...` (every host straight
from the bucket) against `vmrun push FILE` from this machine, and against rclone run by hand
on one host.

The test bed: hosts h1..hN and a "bucket" host running moto's S3 server (the STAND-IN for S3:
the real service serves each VM at gigabytes per second inside its region; moto is Python on
the same two CPUs, so it bounds the bucket rows here), all on the bed's bridge, unlimited, the
way VMs and a bucket share a region; this machine's one link to them (the bed's veth from the
root namespace) limited by a token bucket to RATE, the laptop's uplink. The object goes into
the bucket before the limit is set. Each host gets the real rclone in ~/.vmrun/bin.

    sudo python benchmarks/push_store.py [--size 256M] [--hosts 4] [--rate 200mbit]
        [--rounds 2]

Rows (interleaved rounds, medians; the hosts' folders emptied between):
- `vmrun push data/`, N hosts, --no-relay: every byte from here, N times over the link;
- `vmrun push data/`, N hosts: once over the link, then host to host (vmrun's relay);
- `vmrun push s3://...`, N hosts: every host from the bucket, nothing from here;
- rclone by hand on one host (ssh + rclone copy): the mover's own speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import client_dirs, parse_size  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256M", help="the object's size (1G, 256M)")
    parser.add_argument("--hosts", type=int, default=4, choices=(1, 2, 3, 4))
    parser.add_argument("--rate", default="200mbit", help="this machine's link (tc tbf rate)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    size = parse_size(args.size)

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm, have_root_netns

    if not have_root_netns():
        raise SystemExit("needs root and network namespaces (the test bed)")
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-storebench-"))
    try:
        with NetnsBed(work / "bed", ClientKeys.generate(work / "keys")) as bed:
            run(bed, work, size, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(bed: object, work: Path, size: int, args: argparse.Namespace) -> None:
    from conftest import CACHE  # the cache the tests fill
    from store_fixtures import install_mover, s3_server_on

    hosts = [bed.add_host(f"h{i}") for i in range(1, args.hosts + 1)]  # type: ignore[attr-defined]
    bucket_host = bed.add_host("bucket")  # type: ignore[attr-defined]
    rclone = CACHE / "rclone-1.75.2" / "rclone"
    if not rclone.exists():
        raise SystemExit(f"no {rclone}: run the tests' rclone_binary fixture (or .ci/run) first")
    for host in hosts:
        install_mover(host, rclone)
    link = bed.root_link  # type: ignore[attr-defined]
    with s3_server_on(bucket_host) as endpoint:
        try:
            results = _measure(bed, hosts, endpoint, work, size, args)
        finally:
            subprocess.run(["tc", "qdisc", "del", "dev", link, "root"], check=False)
    n = len(hosts)
    print(
        f"\n{size / 2**20:.0f} MiB to {n} host(s); this machine's link at {args.rate};"
        f" bucket: moto's S3 server on the hosts' network ({args.rounds} round(s),"
        " medians)"
    )
    for row, (median, _) in results.items():
        print(f"  {row:<48} {median:8.2f} s")
    here = results[f"vmrun push data/, {n} hosts, all from here"][0]
    store = results[f"vmrun push s3://, {n} hosts, from the bucket"][0]
    print(f"  bucket push: {here / store:.2f}x the push from here")


def _measure(
    bed: object, hosts: list, endpoint: str, work: Path, size: int, args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """The object into the bucket, then this machine's link limited, then the rows in turn."""
    from store_fixtures import KEY, SECRET, client, new_bucket, s3_env
    from transfer import rounds

    _, project, env = client_dirs(bed, work / "client")
    env.update(s3_env(endpoint))
    data = work / "data"
    data.mkdir()
    (data / "big.bin").write_bytes(os.urandom(size))
    name = new_bucket(endpoint)
    client(endpoint).upload_file(str(data / "big.bin"), name, "ds/big.bin")
    subprocess.run(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            bed.root_link,
            "root",
            "tbf",
            "rate",  # type: ignore[attr-defined]
            args.rate,
            "burst",
            "256k",
            "latency",
            "200ms",
        ],
        check=True,
    )
    flags = [w for h in hosts for w in ("-H", h.name)]
    first = hosts[0]
    conf = first.home / "bench.conf"  # rclone by hand, as a user would configure it
    conf.write_text(
        f"[store]\ntype = s3\nprovider = Other\naccess_key_id = {KEY}\n"
        f"secret_access_key = {SECRET}\nendpoint = {endpoint}\n"
    )
    os.chown(conf, first.uid, first.gid)

    def vmrun(*argv: str) -> Callable[[], None]:
        return _run(
            [sys.executable, "-m", "vmrun", "push", *argv, "--to", "~/pb", *flags], env, project
        )

    def by_hand() -> None:
        first.run(
            [
                str(first.home / ".vmrun" / "bin" / "rclone"),
                "--config",
                str(conf),
                "copy",
                f"store:{name}/ds",
                str(first.home / "pb" / "ds"),
            ],
            as_user=True,
            timeout=3600,
        )

    def clear() -> None:
        for host in hosts:
            host.run(["rm", "-rf", "pb"], as_user=True, timeout=600)

    n = len(hosts)
    cases = {
        f"vmrun push data/, {n} hosts, all from here": vmrun(str(data), "--no-relay"),
        f"vmrun push data/, {n} hosts, host to host": vmrun(str(data)),
        f"vmrun push s3://, {n} hosts, from the bucket": vmrun(f"s3://{name}/ds"),
        "rclone copy by hand, 1 host": by_hand,
    }
    return rounds(cases, args.rounds, clear)


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> Callable[[], None]:
    def go() -> None:
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:6])}... failed: {done.stderr[-2000:]}")

    return go


if __name__ == "__main__":
    main()
