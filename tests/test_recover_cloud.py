"""`train --recover` on a cluster made by `vmrun up`, a VM of it lost for good and no spare:
the run's supervisor (on a host of its own) has the cloud make a new VM of the same spec,
sets it up as `vmrun setup` was asked, and the run goes on from its newest snapshot, with
the laptop's vmrun gone once the run started.

STAND-IN, at the cloud's boundary only (tests/testbed/cloud.py): moto's EC2 and S3, each
instance's addresses a test host's, booted from the user data vmrun sent, the security
group enforced there by nftables; moto listens on the laptop's bed address, so the
supervisor's host reaches it as it would reach EC2. The rest is real: sshd, vmrun setup,
torchrun, rclone, the supervisor."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import TORCH_SPEC, slow_fixture, wait_for
from store_fixtures import install_mover, new_bucket
from testbed import ClientKeys, CloudBed, NetnsBed, TestHost, skip_reason_no_netns
from train_helpers import Gate

from vmrun.config import tomllib
from vmrun.remote_paths import remote_workdir

pytest.importorskip("moto")
pytest.importorskip("flask")

ROOT = Path(__file__).resolve().parent.parent
_NO_NETNS = skip_reason_no_netns()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_NO_NETNS is not None, reason=_NO_NETNS or ""),
]


@dataclass
class Laptop:
    cloud: CloudBed
    watcher: TestHost
    home: Path
    cwd: Path
    env: dict[str, str]

    def vmrun(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = self.cloud.argv([sys.executable, "-m", "vmrun", *args], env=self.env)
        return subprocess.run(
            argv,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def up(self, ssh_from: object) -> subprocess.CompletedProcess[str]:
        """`vmrun up c1 -n 2` (again: the cluster read back from the cloud)."""
        return self.vmrun(
            "up",
            "c1",
            "--type",
            "g4dn.2xlarge",
            "--user",
            self.cloud.user,
            "-n",
            "2",
            "--ssh-from",
            str(ssh_from),
            timeout=240,
        )


@pytest.fixture
@slow_fixture
def laptop(
    tmp_path: Path, host_python: Path, rclone_binary: Path, supervisor_wheels: Path
) -> Iterator[Laptop]:
    """Three machines for a 2-VM cluster and its replacement, each with the bucket mover
    on its fresh disk; the supervisor's host `watcher`, known to the laptop."""
    keys = ClientKeys.generate(tmp_path / "keys")
    with NetnsBed(tmp_path / "bed", keys) as bed:
        watcher = bed.add_host("watcher")

        def boot(host: TestHost) -> None:
            install_mover(host, rclone_binary)

        with CloudBed(
            bed,
            tmp_path / "cloud",
            instances=["n1", "n2", "n3"],
            listen="main",
            enforce_security_groups=True,
            on_boot=boot,
        ) as cloud:
            home = tmp_path / "home"
            (home / ".ssh").mkdir(parents=True, mode=0o700)
            shutil.copy(keys.private, home / ".ssh" / "id_ed25519")
            (home / ".ssh" / "id_ed25519").chmod(0o600)
            (home / ".ssh" / "id_ed25519.pub").write_text(keys.public_line + "\n")
            (home / ".ssh" / "known_hosts").write_text(
                "".join(x + "\n" for x in watcher.known_hosts_lines())
            )
            cwd = tmp_path / "project"
            cwd.mkdir()
            address = watcher.addr_on("main")
            (cwd / "vmrun.toml").write_text(
                f'[[hosts]]\nname = "watcher"\naddress = "{watcher.user}@{address}"\n'
                f'python = "{host_python}"\n'
            )
            env = {
                **cloud.env(),
                "HOME": str(home),
                "XDG_CONFIG_HOME": str(home / ".config"),
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "PYTHONPATH": str(ROOT),
                "LANG": "C.UTF-8",
                "OMP_NUM_THREADS": "1",
                "VMRUN_SUPERVISOR_WHEELS": str(supervisor_wheels),
            }
            yield Laptop(cloud, watcher, home, cwd, env)


def _events(host: TestHost, rid: str) -> list[dict[str, object]]:
    path = host.home / ".vmrun" / "supervisor" / "runs" / rid / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.timeout(900)
def test_a_lost_vm_of_an_up_cluster_is_made_again_and_the_run_goes_on(
    laptop: Laptop, host_python: Path, gate: Gate
) -> None:
    """The run holds after its epoch 7 of 10 (a trainer hook) until the recovery is seen."""
    cloud, watcher = laptop.cloud, laptop.watcher
    bed_net = ipaddress.ip_network(f"{watcher.addr_on('main')}/16", strict=False)
    up = laptop.up(bed_net)  # --ssh-from covers the supervisor's host too
    assert up.returncode == 0, up.stderr + up.stdout
    setup = laptop.vmrun(
        "setup", "@c1", "--python", str(host_python), "--torch", TORCH_SPEC, timeout=300
    )
    assert setup.returncode == 0, setup.stderr + setup.stdout
    assert "[clouds.setup]" in (laptop.cwd / "vmrun.toml").read_text()  # what a new VM gets
    bucket = new_bucket(cloud.endpoint)
    train = laptop.vmrun(
        "train",
        "-H",
        "@c1",
        "--nproc-per-node",
        "1",
        "--epochs",
        "10",
        "--save-every",
        "5",
        "--store",
        f"s3://{bucket}/runs",
        "--recover",
        "--supervisor",
        "watcher",
        *gate.options(7),
        timeout=300,
    )
    assert train.returncode == 0, train.stderr + train.stdout
    rid = re.search(r"run (\S+) started on", train.stderr)
    assert rid, train.stderr
    run_id = rid.group(1)
    n1, n2, n3 = cloud.hosts
    log = n1.home / ".vmrun" / "runs" / run_id / "log"
    wait_for(
        lambda: log.is_file() and "snapshot saved at epoch" in log.read_text(),
        180,
        "a first snapshot",
    )
    (lost,) = [i for i, h in cloud.instance_hosts().items() if h is n2]
    cloud.lose(lost, terminate=False)  # dead, not reclaimed: the supervisor must end it
    said = watcher.home / ".vmrun" / "supervisor" / "runs" / run_id / "log"
    wait_for(lambda: _events(watcher, run_id), 400, "the supervisor's recovery")
    gate.open()
    deadline = time.monotonic() + 300
    while "final model saved" not in log.read_text():
        assert time.monotonic() < deadline, said.read_text()[-4000:] if said.is_file() else ""
        time.sleep(0.5)
    events = _events(watcher, run_id)
    assert [(e["action"], e["swap"]) for e in events] == [("replace", {"c1-1": "c1-1"})]
    assert "c1-1 by a new VM" in str(events[0]["why"])
    ec2 = cloud.client("ec2")
    found = ec2.describe_instances(InstanceIds=[lost])["Reservations"][0]["Instances"][0]
    assert found["State"]["Name"] in ("shutting-down", "terminated")  # not left billing
    renewed = [i for i, h in cloud.instance_hosts().items() if h is n3]
    assert len(renewed) == 1  # the new VM, on the next machine
    metrics = n1.home / remote_workdir(laptop.cwd) / "results" / run_id / "metrics.jsonl"
    epochs = [json.loads(x)["epoch"] for x in metrics.read_text().splitlines()]
    assert epochs == list(range(1, 11))  # none missing, none twice
    assert (n3.home / ".vmrun" / "runs" / run_id / "log").is_file()  # it trained there
    wait_for(lambda: not (said.parent / "id_ed25519").exists(), 120, "the supervisor's end")
    again = laptop.up(bed_net)  # the laptop learns the new VM
    assert again.returncode == 0, again.stderr + again.stdout
    hosts = tomllib.loads((laptop.cwd / "vmrun.toml").read_text())["hosts"]
    (renewed_host,) = [h for h in hosts if h.get("name") == "c1-1"]
    assert renewed_host["address"].endswith(f"@{n3.addr_on('main')}"), hosts
    status = laptop.vmrun("status", "-H", "@c1", "--json")
    (row,) = [r for r in json.loads(status.stdout) if r.get("run") == run_id]
    assert row["state"] == "done" and row["recoveries"]["count"] == 1, row
