"""`vmrun up` / `vmrun down` against moto's EC2 server on 127.0.0.1: how many API calls each
makes, and how much time vmrun itself adds beyond the calls (goal: well under a second).

The calls are what AWS charges in latency (tens to hundreds of ms each in a real region); the
rest is vmrun's own: the image choice, the host key it makes, vmrun.toml and known_hosts
written, its imports. A user doing it by hand runs the same calls (`aws ec2 run-instances`
and friends, one process each), so the call count is the yardstick.

moto's instances run no sshd, so the SSH wait is left out (STAND-IN: a no-op; the netns
test tests/test_cloud_e2e.py logs in for real), and moto has no placement groups: those
calls are answered in-process (tests/aws_fakes.py; counted, taking ~0 ms). Nothing is dialled
but 127.0.0.1.

    python benchmarks/cloud_up.py [--runs 5] [--count 2]

Needs boto3, moto, flask and flask-cors (the dev extra).

Measured here (2 cores, moto 5.2 in this process, medians of 7, 2 instances): `up` 15 calls
(99.6 ms in them) and 37 ms of vmrun's own; `down` 8 calls (41 ms) and 22 ms of its own.
By hand the same steps are 6 to 8 `aws ec2 ...` commands, each a process of its own.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=2)
    args = parser.parse_args()
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        print(f"missing: {exc.name} (pip install -e '.[dev,aws]')")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="vmrun-bench-cloud-"))
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519.pub").write_text("ssh-ed25519 AAAAbench bench@here\n")
    (tmp / "work").mkdir()
    os.chdir(tmp / "work")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        AWS_CONFIG_FILE="/nonexistent",
        MOTO_EC2_LOAD_DEFAULT_AMIS="false",
    )
    for name in ("AWS_PROFILE", "VMRUN_CONFIG", "SSH_AUTH_SOCK"):
        os.environ.pop(name, None)
    try:
        image = boto3.client("ec2").register_image(Name="gpu", RootDeviceName="/dev/sda1")
        return _measure(image["ImageId"], args.runs, args.count)
    finally:
        server.stop()


def _measure(image: str, runs: int, count: int) -> int:
    from aws_fakes import placement_groups_on

    from vmrun.config import load_settings
    from vmrun.operations import cloud
    from vmrun.providers.aws.session import Session

    calls: list[tuple[str, float]] = []
    groups: dict[str, Any] = {}  # the placement groups, across the Sessions up and down make
    started: dict[int, float] = {}
    real_client = Session.client

    def client(self: Session, service: str, region: str, **kw: Any) -> Any:
        made = real_client(self, service, region, **kw)
        if not getattr(made, "_bench_hooked", False):
            if service == "ec2":
                placement_groups_on(made, groups)  # moto has none: answered in-process
            made.meta.events.register("before-call.*.*", _before)
            made.meta.events.register("after-call.*.*", _after)
            made._bench_hooked = True
        return made

    def _before(model: Any, **_: Any) -> None:
        started[id(model)] = time.perf_counter()

    def _after(model: Any, **_: Any) -> None:
        calls.append(
            (model.name, time.perf_counter() - started.pop(id(model), time.perf_counter()))
        )

    Session.client = client  # type: ignore[method-assign]
    cloud._wait_ssh = lambda *a, **k: None  # STAND-IN: moto's instances run no sshd
    rows = []
    for run in range(runs):
        ask = cloud.UpAsk(
            name=f"bench{run}",
            instance_type="g4dn.2xlarge",
            count=count,
            image=image,
            ssh_from="198.51.100.7/32",
        )
        for what, work in (
            ("up", lambda a=ask: cloud.up(load_settings(), a)),
            ("down", lambda a=ask: cloud.down(load_settings(), a.name)),
        ):
            calls.clear()
            begin = time.perf_counter()
            work()
            total = time.perf_counter() - begin
            in_api = sum(t for _, t in calls)
            rows.append((what, total, in_api, len(calls), collections.Counter(n for n, _ in calls)))
    for what in ("up", "down"):
        mine = [r for r in rows if r[0] == what]
        totals = [r[1] for r in mine]
        api = [r[2] for r in mine]
        own = [t - a for t, a in zip(totals, api, strict=True)]
        print(
            f"{what:5s} {count} instance(s): {statistics.median(totals) * 1000:7.1f} ms in all,"
            f" {mine[-1][3]} API calls taking {statistics.median(api) * 1000:7.1f} ms,"
            f" vmrun's own {statistics.median(own) * 1000:6.1f} ms (medians of {runs})"
        )
        print("      calls: " + ", ".join(f"{n} {c}" for n, c in sorted(mine[-1][4].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
