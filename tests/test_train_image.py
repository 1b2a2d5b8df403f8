"""`vmrun train --image` on test hosts with a real Docker Engine (tests/testbed/docker.py):
hosts d1 and d2 each run their own dockerd, pull the test image (Debian + torch 2.13.0 CPU)
from the bed's registry for real, and run the run's processes in it with host networking.

The bed's daemons cannot raise `memlock` above this machine's hard limit (no
CAP_SYS_RESOURCE here), so the project sets `container_ulimits` to that limit; NGC's
`memlock=-1` is what a GPU host's daemon gets by default (tested as a value, and here as
the refusal it meets: `container-rlimits`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, error_in, run_id_of, run_pids, sshd_tails, template_out, wait_for
from testbed.docker import DockerBed, memlock_hard_limit
from train_helpers import assert_matches_one_process, env_options, hook_env

from vmrun.remote_paths import remote_workdir


def _ulimits() -> str:
    hard = memlock_hard_limit()
    memlock = "memlock=-1" if hard is None else f"memlock={hard}"
    return f'container_ulimits = ["{memlock}", "stack=67108864"]\n'


@pytest.fixture
def dclient(docker_hosts: DockerBed, client: Client) -> Iterator[Client]:
    """A project on d1 and d2 (no setup: the image brings Python and torch); afterwards no
    run process, container or vmrun file is left on them."""
    bed = docker_hosts.bed
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    (client.cwd / "vmrun.toml").write_text(
        _ulimits() + "".join(f'\n[[hosts]]\naddress = "{h.name}"\n' for h in docker_hosts.hosts)
    )
    client.extra_env["OMP_NUM_THREADS"] = "1"
    yield client
    left: dict[str, list[str]] = {}
    for host in docker_hosts.hosts:
        host.heal_link()
        daemon = docker_hosts.daemons[host.name]
        left[host.name] = daemon.containers()
        if left[host.name]:
            daemon.docker("rm", "-f", *left[host.name], check=False)
        for pid in run_pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda h=host: not run_pids(h), 10, f"no run process left on {host.name}")
        for folder in (".vmrun", "vmrun"):
            host.run(["rm", "-rf", str(host.home / folder)], as_user=True)
    assert not any(left.values()), f"containers left behind: {left}"


def _record(host, rid: str) -> dict:
    return json.loads((host.home / ".vmrun" / "runs" / rid / "run.json").read_text())


@pytest.mark.timeout(600)
def test_template_on_two_hosts_in_the_image_equals_one_process(
    docker_hosts: DockerBed, dclient: Client, tmp_path: Path
) -> None:
    """2 hosts x 2 processes inside the image: the final weights equal a one-process run's
    (real DDP across the containers, c10d over the hosts' own network); the pull is real
    and shown; the files are the user's; no container is left."""
    image = docker_hosts.image
    for daemon in docker_hosts.daemons.values():  # an earlier test's pull: these are real
        daemon.docker("rmi", image, check=False)
    args = ["4", "2", "--batch-size", "8", "--dataset-size", "512", "--deterministic"]
    done = dclient.vmrun(
        "train", "--image", image, "--nproc-per-node", "2", "--", *args, timeout=400
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    for host in docker_hosts.hosts:  # the bytes come from the pull's own progress bars
        assert re.search(
            rf"{host.name}: pulled {re.escape(image)} \(\d+ layers, \d+ MiB", done.stderr
        ), done.stderr
        rec = _record(host, rid)
        assert rec["image"] == image and str(rec["image_digest"]).startswith("sha256:")
        assert rec["container_runtime"] == "docker"
    assert "2 nodes x 2 process(es)" in done.stderr
    d1 = docker_hosts.hosts[0]
    final = template_out(d1, dclient, rid) / "finalmodel.pt"
    assert final.stat().st_uid == d1.uid and final.stat().st_gid == d1.gid
    one = ["4", "2", "--batch-size", "32", "--dataset-size", "512", "--deterministic"]
    assert_matches_one_process(final, one, tmp_path / "single")
    fetched = dclient.vmrun("fetch", "--run", rid, timeout=120)
    assert fetched.returncode == 0, fetched.stderr
    local = dclient.cwd / "results" / rid / "finalmodel.pt"  # the nodes' outputs in one folder
    assert local.read_bytes() == final.read_bytes()

    (dclient.cwd / "hello.py").write_text("print('hello from the image')\n")  # no torch: quick
    again = dclient.vmrun(
        "train", "hello.py", "--launcher", "python", "--image", image, "-H", d1.name, timeout=300
    )
    assert again.returncode == 0, again.stderr + again.stdout
    assert f"{d1.name}: image {image} is there already" in again.stderr
    assert "hello from the image" in again.stdout


@pytest.mark.timeout(300)
def test_a_script_in_the_image_writes_the_project_as_the_user_and_reads_a_mount(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    """An unchanged script (the python launcher) writes into the project directory on the
    host, owned by the user; a --mount brings a host folder in; HOME is writable."""
    d1 = docker_hosts.hosts[0]
    data = d1.home / "data"
    d1.run(["mkdir", "-p", str(data)], as_user=True)
    d1.run(["sh", "-c", f"echo 41 > {data}/n.txt"], as_user=True)
    (dclient.cwd / "job.py").write_text(
        "import os, pathlib, torch\n"
        "n = int(open('/data/n.txt').read()) + 1\n"
        "pathlib.Path(os.environ['HOME'], 'cache.txt').write_text('ok')\n"
        "open('out.txt', 'w').write(f'{n} {os.getuid()} {torch.__version__}')\n"
        "print('wrote', n, flush=True)\n"
    )
    done = dclient.vmrun(
        "train",
        "job.py",
        "-H",
        d1.name,
        "--launcher",
        "python",
        "--image",
        docker_hosts.image,
        "--mount",
        f"{data}:/data:ro",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "wrote 42" in done.stdout
    out = d1.home / remote_workdir(dclient.cwd) / "out.txt"
    assert out.stat().st_uid == d1.uid
    n, uid, version = out.read_text().split()
    assert (n, int(uid)) == ("42", d1.uid) and version.startswith("2.13.0")
    assert (d1.home / ".vmrun" / "container-home" / "cache.txt").read_text() == "ok"
    # the image's own Python described the image's packages, beside the run (run_in_image.sh)
    rec = d1.home / ".vmrun" / "runs" / run_id_of(done.stderr)
    wait_for(lambda: (rec / "versions.json").exists(), 30, "the run's provenance")
    facts = json.loads((rec / "provenance.json").read_text())
    assert facts["environment"]["packages"]["torch"].startswith("2.13.0")
    assert (
        facts["environment"]["python"]["version"]
        == json.loads((rec / "versions.json").read_text())["python"]
    )
    assert facts["hardware"]["hostname"] == d1.hostname  # host networking: the host's name
    (dclient.cwd / "fail.py").write_text("import sys\nprint('failing', flush=True)\nsys.exit(3)\n")
    failed = dclient.vmrun(
        "train",
        "fail.py",
        "-H",
        d1.name,
        "--launcher",
        "python",
        "--image",
        docker_hosts.image,
        timeout=240,
    )
    assert failed.returncode == 3, failed.stderr  # the container's exit code is the run's
    assert error_in(failed.stderr)[0] == "run-failed" and "failing" in failed.stdout
    if memlock_hard_limit() is None:  # a machine whose daemon may raise memlock: no refusal
        return
    refused = dclient.vmrun(
        "train",
        "fail.py",
        "-H",
        d1.name,
        "--launcher",
        "python",
        "--image",
        docker_hosts.image,
        timeout=240,
        env={"VMRUN_CONTAINER_ULIMITS": "memlock=-1"},
    )  # NGC's
    assert refused.returncode == 125, refused.stderr  # runc refused it: the client's status
    code, said = error_in(refused.stderr)
    assert code == "container-rlimits" and "memlock" in said, refused.stderr


@pytest.mark.timeout(300)
def test_stop_ends_the_run_and_leaves_no_container(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    d1 = docker_hosts.hosts[0]
    daemon = docker_hosts.daemons[d1.name]
    done = dclient.vmrun(
        "train",
        "-H",
        d1.name,
        "--image",
        docker_hosts.image,
        "--epochs",
        "100000",
        "--save-every",
        "1000",
        "--detach",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    wait_for(lambda: len(daemon.containers()) == 1, 60, "the run's container")
    logs = lambda: dclient.vmrun("logs", rid, timeout=60).stdout  # noqa: E731
    wait_for(lambda: "epoch" in logs(), 120, "the first epoch in the log", interval=1)
    t = time.monotonic()
    stopped = dclient.vmrun("stop", rid, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - t < 30
    assert daemon.containers() == []
    wait_for(lambda: not run_pids(d1, rid), 10, "the run's processes to end")
    status = dclient.vmrun("status", "--json", timeout=60)
    runs = {r["run"]: r for r in json.loads(status.stdout) if r.get("run")}
    assert runs[rid]["state"] == "stopped" and runs[rid]["image"] == docker_hosts.image


def test_bad_inputs_are_one_line_before_anything_starts(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    d1 = docker_hosts.hosts[0]
    daemon = docker_hosts.daemons[d1.name]
    image = docker_hosts.image
    cases = [
        (["--image", image, "--mount", "/nowhere/data:/data"], "mount-source-missing", 2),
        (["--image", image.rsplit(":", 1)[0] + ":no-such-tag"], "image-not-found", 2),
        (["--image", "Upper/Case:1"], "bad-image", 2),
        (["--mount", "/data:/data"], "bad-mount", 2),
    ]
    for flags, code, status in cases:
        done = dclient.vmrun("train", "-H", d1.name, *flags, timeout=120)
        assert done.returncode == status, (flags, done.stderr)
        assert error_in(done.stderr)[0] == code, (flags, done.stderr)
        assert not (d1.home / ".vmrun" / "runs").exists() or not list(
            (d1.home / ".vmrun" / "runs").iterdir()
        ), flags
    if shutil.which("podman") is None:  # the test hosts share this machine's programs
        toml = dclient.cwd / "vmrun.toml"
        toml.write_text('container_runtime = "podman"\n' + toml.read_text())
        done = dclient.vmrun("train", "-H", d1.name, "--image", image, timeout=120)
        assert done.returncode == 2 and error_in(done.stderr)[0] == "container-runtime-missing"
    assert daemon.containers() == []


@pytest.mark.timeout(400)
def test_an_image_on_the_hosts_in_no_reachable_registry_and_nodes_on_different_images(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    """The hosts' engines hold an image whose registry does not answer (a test host's closed
    port: as an air-gapped host's `docker load`): pull = newer (the default) keeps each
    host's own copy and says so, `--pull never` runs it without asking, `--pull always` is
    the registry's error. Then d2's copy is another image under the same name: refused with
    both nodes named, nothing started."""
    d1, d2 = docker_hosts.hosts
    gone = f"{d1.addr}:5999/acc/torch:cpu"  # nothing listens there
    for daemon in docker_hosts.daemons.values():
        daemon.docker("pull", docker_hosts.image, timeout=300)  # there already, or brought
        daemon.docker("tag", docker_hosts.image, gone)
    (dclient.cwd / "hello.py").write_text("print('in the image', flush=True)\n")
    try:
        kept = dclient.vmrun(
            "train", "hello.py", "-H", d1.name, "--launcher", "python", "--image", gone, timeout=240
        )
        assert kept.returncode == 0, kept.stderr
        assert "in the image" in kept.stdout
        assert f"{d1.name}: kept this host's own {gone}" in kept.stderr, kept.stderr
        never = dclient.vmrun(
            "train",
            "hello.py",
            "-H",
            d1.name,
            "--launcher",
            "python",
            "--image",
            gone,
            "--pull",
            "never",
            timeout=240,
        )
        assert never.returncode == 0 and "is on the host; not pulled" in never.stderr
        always = dclient.vmrun(
            "train",
            "hello.py",
            "-H",
            d1.name,
            "--launcher",
            "python",
            "--image",
            gone,
            "--pull",
            "always",
            timeout=240,
        )
        assert always.returncode == 14 and error_in(always.stderr)[0] == "registry-unreachable"
        other = docker_hosts.daemons[d2.name]
        made = other.docker("create", gone, "true").stdout.strip()
        other.docker("commit", made, gone)  # the same name, another image
        other.docker("rm", made)
        differ = dclient.vmrun(
            "train", "hello.py", "-H", d1.name, "-H", d2.name, "--image", gone, timeout=240
        )
        assert differ.returncode == 2, differ.stderr
        code, said = error_in(differ.stderr)
        assert code == "images-differ" and f"on {d1.name}" in said and f"on {d2.name}" in said
        assert not list((d2.home / ".vmrun" / "runs").glob("hello-*")), "a run was started"
    finally:
        for daemon in docker_hosts.daemons.values():
            daemon.docker("rmi", gone, check=False)


def _host_pid(host, rid: str, pid_inside: int) -> int:
    """The host's pid of a run's process that has `pid_inside` in its container."""
    for pid in run_pids(host, rid):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            found = re.search(r"^NSpid:\s+(.*)$", status, re.M)
            ids = found.group(1).split() if found else []
            if len(ids) > 1 and ids[-1] == str(pid_inside):
                return pid
    raise AssertionError(f"no process of {rid} has pid {pid_inside} in its container")


@pytest.mark.timeout(400)
def test_a_killed_worker_restarts_inside_the_container_from_the_last_snapshot(
    docker_hosts: DockerBed, dclient: Client, trainer_hooks: Path
) -> None:
    """--max-restarts in the image: a worker SIGKILLed on the host (a container's processes
    are the host's) is restarted by torchrun inside, from the last snapshot; every rank stalls
    mid-epoch 5 first (a trainer hook, mounted read-only), so the kill lands after one."""
    d1 = docker_hosts.hosts[0]
    hooks = hook_env(trainer_hooks, STALL_AT_EPOCH="5")
    done = dclient.vmrun(
        "train",
        "-H",
        d1.name,
        "--image",
        docker_hosts.image,
        "--mount",
        f"{trainer_hooks}:{trainer_hooks}:ro",
        "--detach",
        "--max-restarts",
        "2",
        *env_options(hooks),
        "--",
        "12",
        "3",
        "--dataset-size",
        "8192",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    out = template_out(d1, dclient, rid)
    pid_files = [out / f"stalled-rank{r}.pid" for r in (0, 1)]
    wait_for(lambda: all(p.exists() for p in pid_files), 180, "both ranks to stall in epoch 5")
    os.kill(_host_pid(d1, rid, int(pid_files[1].read_text())), signal.SIGKILL)
    follow = dclient.vmrun("logs", "-f", rid, timeout=300)
    assert follow.returncode == 0, follow.stderr + follow.stdout
    resumed = re.findall(
        r"^\[rank(\d)\] resumed from snapshot at epoch (\d+) ", follow.stdout, re.M
    )
    assert sorted(resumed) == [("0", "4"), ("1", "4")], follow.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == list(range(1, 13))


@pytest.mark.timeout(500)
def test_a_cut_link_leaves_the_run_going_and_resume_goes_on_in_the_same_image(
    docker_hosts: DockerBed, dclient: Client, trainer_hooks: Path
) -> None:
    """The run in its container goes on while the host is cut off; stopped, then resumed
    with `--resume` and no --image, it runs again in its recorded image from its snapshot."""
    d1 = docker_hosts.hosts[0]
    hooks = hook_env(trainer_hooks, EPOCH_DELAY="0.3")
    mount = f"{trainer_hooks}:{trainer_hooks}:ro"
    done = dclient.vmrun(
        "train",
        "-H",
        d1.name,
        "--image",
        docker_hosts.image,
        "--mount",
        mount,
        "--detach",
        *env_options(hooks),
        "--",
        "400",
        "2",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    log = d1.home / ".vmrun" / "runs" / rid / "log"

    def epochs() -> int:
        return len(re.findall(rb"epoch (\d+)/400", log.read_bytes())) if log.exists() else 0

    wait_for(lambda: epochs() >= 2, 180, "two epochs")
    d1.cut_link()
    seen = epochs()
    wait_for(lambda: epochs() >= seen + 3, 60, "epochs while the host is cut off", interval=0.2)
    d1.heal_link()
    wait_for(lambda: b"snapshot saved" in log.read_bytes(), 60, "a snapshot")
    stopped = dclient.vmrun("stop", rid, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert docker_hosts.daemons[d1.name].containers() == []
    again = dclient.vmrun("train", "--resume", rid, *env_options(hooks), "--detach", timeout=240)
    assert again.returncode == 0, again.stderr
    assert _record(d1, rid)["image"] == docker_hosts.image
    wait_for(lambda: b"resumed from snapshot" in log.read_bytes(), 180, "the resumed attempt")
    assert len(docker_hosts.daemons[d1.name].containers()) == 1  # in the image again
    assert dclient.vmrun("stop", rid, timeout=120).returncode == 0


@pytest.mark.timeout(400)
def test_train_local_runs_in_the_image_with_this_machines_engine(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    """`--local --image`: this machine's docker client (here pointed at d2's daemon) pulls
    the image and runs the template in it; its files land in the project's results/."""
    daemon = docker_hosts.daemons[docker_hosts.hosts[1].name]
    daemon.docker("rmi", docker_hosts.image, check=False)  # so that the pull below is real
    env = {"DOCKER_HOST": f"unix://{daemon.socket}"}
    done = dclient.vmrun(
        "train",
        "--local",
        "--image",
        docker_hosts.image,
        "--epochs",
        "2",
        "--save-every",
        "1",
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"pulled {docker_hosts.image} (" in done.stderr
    rid = re.search(r"run (\S+): ", done.stderr).group(1)
    out = dclient.cwd / "results" / rid
    assert (out / "finalmodel.pt").stat().st_uid == os.getuid()
    assert json.loads((out / "run.json").read_text())["image"] == docker_hosts.image
    assert "epoch 2/2" in done.stdout
    # this machine's hardware; the image's digest (run.json) names the run's packages
    assert json.loads((out / "provenance.json").read_text())["environment"] == {"in_image": True}
    assert daemon.containers() == []


@pytest.mark.timeout(400)
def test_doctor_checks_the_image_and_runs_its_all_reduce_in_it(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    """vmrun.toml's `image`: doctor checks each host's runtime instead of a Python of its
    own (these hosts have no setup), and the all-reduce runs in the image on both."""
    from test_cli_doctor import rows

    toml = dclient.cwd / "vmrun.toml"
    toml.write_text(f'image = "{docker_hosts.image}"\n' + toml.read_text())
    done = dclient.vmrun("doctor", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + sshd_tails(docker_hosts.hosts)
    found = rows(done.stdout)
    for host in docker_hosts.hosts:
        verdict, detail = found[("image", host.name)]
        assert verdict == "OK" and "docker" in detail, detail
        assert ("python", host.name) not in found
    verdict, detail = found[("allreduce", "all")]
    assert verdict == "OK" and detail.startswith("world 4,"), detail


@pytest.mark.timeout(300)
def test_stacks_of_a_run_in_the_image_are_read_from_the_host(
    docker_hosts: DockerBed, dclient: Client
) -> None:
    """`vmrun stacks` on a live 2 x 2 run in the image: py-spy runs on each host against
    the container's processes (they are the user's), every rank found in the user's file;
    a stall there is found by the hang watcher as on bare hosts."""
    shutil.copy(Path(__file__).parent / "hang_scripts" / "hang_rank.py", dclient.cwd)
    done = dclient.vmrun(
        "train",
        "hang_rank.py",
        "--image",
        docker_hosts.image,
        "--nproc-per-node",
        "2",
        "--detach",
        "--env",
        "HANG_RANK=3",
        "--env",
        "HANG_AT=4",
        "--hang-timeout",
        "5s",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    d1, d2 = docker_hosts.hosts
    hang = d2.home / ".vmrun" / "runs" / rid / "hang"
    try:
        log = d1.home / ".vmrun" / "runs" / rid / "log"
        wait_for(lambda: log.exists() and "step 2 " in log.read_text(), 120, "the run's steps")
        live = dclient.vmrun("stacks", rid, timeout=60)
        assert live.returncode == 0, live.stderr + live.stdout
        assert "hang_rank.py:" in live.stdout, live.stdout
        ranks = [
            int(n)
            for n in re.findall(
                r"\d+",
                " ".join(re.findall(r"^ranks? ([\d,-]+)", live.stdout, re.M))
                .replace("-", " ")
                .replace(",", " "),
            )
        ]
        assert set(ranks) >= {0, 3}, live.stdout
        wait_for(hang.exists, 60, "the hang watcher in the image's run")
        shown = dclient.vmrun("stacks", rid, "--hang", timeout=60)
        assert shown.returncode == 0, shown.stderr + shown.stdout
        assert re.search(r"rank 3 \(d2\): in wait_forever at hang_rank\.py:\d+", shown.stdout), (
            shown.stdout
        )
    finally:
        dclient.vmrun("stop", rid, timeout=60)
