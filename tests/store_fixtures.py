"""A bucket for the tests: moto's S3 server (real HTTP, S3's own answers) on an address the
test picks, and what a test puts in it. moto keeps its buckets in this process, so a test
makes its own bucket (a fresh name) and removes nothing else's."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

KEY = "testing"  # moto takes any key; the secret is what the tests look for where it must not be
SECRET = "vmrun-test-secret-" + "7" * 20


@contextmanager
def s3_server(address: str = "127.0.0.1") -> Iterator[str]:
    """moto's S3 server on `address` (any free port); its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=address, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def s3_server_on(host: Any, port: int = 9000) -> Iterator[str]:
    """moto's S3 server in its own process on a test host (the hosts' network reaches it, and
    so does this machine); its endpoint URL. Killed by its pid at the end."""
    import socket
    import subprocess
    import sys
    import time

    server = host.popen(
        [sys.executable, "-m", "moto.server", "-H", host.addr, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex((host.addr, port)) == 0:
                    break
            if time.monotonic() > deadline or server.poll() is not None:
                raise AssertionError(f"moto's S3 server did not answer on {host.addr}:{port}")
            time.sleep(0.1)
        yield f"http://{host.addr}:{port}"
    finally:
        server.kill()
        server.wait(timeout=30)


@contextmanager
def bed_bucket(bed: Any) -> Iterator[tuple[str, Any]]:
    """moto's S3 server on the bed's own test host, "bucket", reached by the hosts and this
    machine alike: its endpoint, and that host (to take the bucket down)."""
    try:
        host = bed.host("bucket")
    except KeyError:
        host = bed.add_host("bucket")
    with s3_server_on(host) as endpoint:
        yield endpoint, host


@pytest.fixture(scope="module", name="bucket")
def bucket_fixture(bed: Any) -> Iterator[tuple[str, Any]]:
    """The bed's bucket for a test module (import it there): its endpoint and host."""
    with bed_bucket(bed) as found:
        yield found


def install_mover(host: Any, rclone: Path) -> Path:
    """rclone where vmrun looks for its own copy on a host (~/.vmrun/bin), owned by the
    host's user; its path there."""
    bin_dir = host.home / ".vmrun" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(rclone, bin_dir / "rclone")
    for path in (host.home / ".vmrun", bin_dir, bin_dir / "rclone"):
        os.chown(path, host.uid, host.gid)
    return bin_dir / "rclone"


@contextmanager
def two_hosts_with_mover(bed: Any, client: Any, python: Path, rclone: Path) -> Iterator[Any]:
    """h1 and h2 in the client's vmrun.toml with `python`, each with the mover where vmrun
    looks for its own copy; both hosts cleaned afterwards."""
    from conftest import clean_host

    (client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{python}"\n\n'
        f'[[hosts]]\naddress = "h2"\npython = "{python}"\n'
    )
    client.extra_env["OMP_NUM_THREADS"] = "1"
    for name in ("h1", "h2"):
        install_mover(bed[name], rclone)
    try:
        yield client
    finally:
        for name in ("h1", "h2"):
            clean_host(bed[name])


def s3_env(endpoint: str) -> dict[str, str]:
    """What vmrun reads the bucket's access from (no ~/.aws, no metadata service)."""
    return {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


def new_bucket(endpoint: str) -> str:
    name = f"vmrun-{secrets.token_hex(4)}"
    client(endpoint).create_bucket(Bucket=name)
    return name


def put(endpoint: str, bucket: str, key: str, data: bytes) -> None:
    client(endpoint).put_object(Bucket=bucket, Key=key, Body=data)


def put_corrupted(endpoint: str, bucket: str, key: str, data: bytes) -> None:
    """An object whose recorded checksum is not its bytes' (bit rot, a bad copy): uploaded
    in two parts (so its ETag is no MD5) with the `md5chksum` metadata rclone checks set to
    another content's."""
    from boto3.s3.transfer import TransferConfig

    other = hashlib.md5(data + b"x").digest()
    client(endpoint).upload_fileobj(
        io.BytesIO(data),
        bucket,
        key,
        ExtraArgs={"Metadata": {"md5chksum": base64.b64encode(other).decode()}},
        Config=TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20),
    )
