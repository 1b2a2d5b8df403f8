"""A run inside an image on SSH hosts, its decisions in milliseconds: where image settings
come from (flags, vmrun.toml, a host's table, a resumed run's record), the host probe run
here on a temporary HOME with stand-in runtimes on the PATH, which runtime is chosen, the
registry login, one image everywhere, and the container a node's processes start in.
The real path (a real Docker Engine on the test hosts) is tests/test_train_image.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from conftest import local_argv

from vmrun.backends.hosts import images
from vmrun.containers.image import ImageRef, parse_image, parse_mount
from vmrun.containers.request import Asked, Request
from vmrun.containers.runtime import PASSWORD_ENV, RUNTIMES
from vmrun.errors import VmrunError
from vmrun.reporting import Recorder
from vmrun.results.record import RunRecord
from vmrun.ssh.result import CommandResult
from vmrun.transfer.types import Progress

IMAGE = "reg.example:5000/team/torch:2.13.0"


def _code(fn, *args, **kw) -> str:
    with pytest.raises(VmrunError) as caught:
        fn(*args, **kw)
    return caught.value.code


# -- where the settings come from ---------------------------------------------------------------


def test_a_hosts_table_wins_over_the_project_and_the_flag_over_both() -> None:
    project = {"image": "a/b:1", "mounts": ["/data:/data"], "container_runtime": "auto"}
    asked = Asked(defaults=project)
    assert str(asked.resolve({}).image) == "a/b:1"
    own = asked.resolve({"image": "c/d:2", "container_runtime": "podman"})
    assert (str(own.image), own.runtime) == ("c/d:2", "podman")
    flagged = Asked("e/f:3", ("/scratch:/data:ro", "/x:/x"), project)
    got = flagged.resolve({"image": "c/d:2"})
    assert str(got.image) == "e/f:3"
    # a --mount with the same destination replaces the table's
    assert [str(m) for m in got.mounts] == ["/scratch:/data:ro", "/x:/x"]
    assert Asked(defaults={"image": ""}).resolve({}) is None


def test_bad_values_are_refused_before_anything_starts() -> None:
    assert _code(Asked("Bad/Name:1").check) == "bad-image"
    assert _code(Asked("a/b:1", ("data:/data",)).check) == "bad-mount"
    mount_only = Asked("", ("/data:/data",))
    mount_only.check()  # a host's or a cluster's table may give the image
    assert _code(mount_only.resolve, {}) == "bad-mount"  # none did: a mount needs an image
    assert str(mount_only.resolve({"image": "a/b:1"}).mounts[0]) == "/data:/data"
    bad_limit = Asked("a/b:1", defaults={"container_ulimits": ["memlock"]})
    assert _code(bad_limit.check) == "bad-ulimit"


def test_a_resumed_run_keeps_what_it_ran_with_whatever_the_tables_say() -> None:
    ran = Request(parse_image(IMAGE), runtime="docker", ulimits=("stack=1",))
    image = RunRecord.from_json(ran.meta()).launch.image  # as run.json keeps it
    assert image is not None
    back = image.request()
    assert back == ran
    assert Asked(recorded=back, fixed=True).resolve({"image": "x/y:1"}) == ran
    assert Asked(recorded=None, fixed=True).resolve({"image": "x/y:1"}) is None  # ran bare


# -- the probe, run here with stand-in runtimes ---------------------------------------------------


class LocalConn:
    """A connection whose commands run here, in `home`, with `path` first on the PATH."""

    def __init__(self, home: Path, path: Path, label: str = "h1") -> None:
        self.home, self.path, self.label = home, path, label
        self.ran: list[list[str]] = []
        self.envs: list[Mapping[str, str] | None] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        env=None,
        on_output=None,
        check=False,
        what=None,
        activity=True,
    ) -> CommandResult:
        self.ran.append(list(argv))
        self.envs.append(env)
        environ = {
            "PATH": f"{self.path}:{_tools(self.home.parent)}",
            "HOME": str(self.home),
            **(env or {}),
        }
        done = subprocess.run(
            local_argv(argv, self.home), env=environ, capture_output=True, cwd=self.home, timeout=20
        )
        if on_output is not None:
            on_output("out", done.stdout)
        result = CommandResult(
            self.label,
            tuple(argv),
            done.returncode,
            done.stdout.decode(),
            done.stderr.decode(),
            0.0,
        )
        if check and not result.ok:
            raise AssertionError(result.stderr_tail)
        return result


TOOLS = (
    "id",
    "mkdir",
    "mktemp",
    "script",
    "tr",
    "sed",
    "cat",
    "rm",
    "sh",
    "grep",
    "tee",
    "cut",
    "tail",
)


def _tools(where: Path) -> Path:
    """A PATH folder with the plain tools the host scripts use, and no container runtime
    (this machine may have one)."""
    folder = where / "tools"
    if not folder.is_dir():
        folder.mkdir()
        for name in TOOLS:
            found = shutil.which(name)
            if found:
                (folder / name).symlink_to(found)
    return folder


def _bin(tmp_path: Path, *names: str, body: str = "exit 0") -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def test_the_probe_finds_the_runtime_the_ids_and_makes_the_containers_home(
    host_home: Path, tmp_path: Path
) -> None:
    conn = LocalConn(host_home, _bin(tmp_path, "podman", "docker"))
    data = tmp_path / "data"
    data.mkdir()
    request = Request(parse_image(IMAGE), (parse_mount(f"{data}:/data"),))
    node = images.probe(conn, request)  # type: ignore[arg-type]
    assert node.runtime.name == "docker"  # auto: docker first where both are there
    assert (node.uid, node.gid) == (os.getuid(), os.getgid())
    assert (host_home / images.CONTAINER_HOME).is_dir()
    assert len(conn.ran) == 1  # one round trip


def test_the_probe_refuses_a_missing_source_a_missing_runtime_and_a_slurm_runtime(
    host_home: Path, tmp_path: Path
) -> None:
    only_podman = LocalConn(host_home, _bin(tmp_path, "podman"))
    missing = Request(parse_image(IMAGE), (parse_mount("/no/such/dir:/data"),))
    assert _code(images.probe, only_podman, missing) == "mount-source-missing"
    plain = Request(parse_image(IMAGE))
    assert images.probe(only_podman, plain).runtime.name == "podman"  # type: ignore[arg-type]
    named = Request(parse_image(IMAGE), runtime="docker")
    assert _code(images.probe, only_podman, named) == "container-runtime-missing"
    pyxis = Request(parse_image(IMAGE), runtime="pyxis")
    assert _code(images.probe, only_podman, pyxis) == "container-option-unsupported"
    sif = Request(parse_image("/images/torch.sif"))
    assert _code(images.probe, only_podman, sif) == "container-option-unsupported"


# -- the pull ------------------------------------------------------------------------------------


def test_the_registry_login_comes_from_this_machines_environment(monkeypatch) -> None:
    ngc = parse_image("nvcr.io/nvidia/pytorch:24.05-py3")
    other = parse_image(IMAGE)
    assert isinstance(ngc, ImageRef) and isinstance(other, ImageRef)
    for name in ("NGC_API_KEY", "VMRUN_REGISTRY_USER", PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    assert images.credentials(ngc) is None
    monkeypatch.setenv("NGC_API_KEY", "k3y")
    assert images.credentials(ngc) == ("$oauthtoken", {PASSWORD_ENV: "k3y"})
    assert images.credentials(other) is None  # NGC's key goes to NGC only
    monkeypatch.setenv("VMRUN_REGISTRY_USER", "bob")
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    assert images.credentials(other) == ("bob", {PASSWORD_ENV: "pw"})


PULLED = (
    "0123456789ab: Pulling fs layer\r\n0123456789ab: Downloading [=>  ]  1MB/2MB\r"
    "0123456789ab: Pull complete\r\nDigest: sha256:" + "cd" * 32 + "\r\n"
    "Status: Downloaded newer image for x\r\n"
)


def test_the_pull_shows_bytes_and_keeps_the_digest_and_the_password_off_the_argv(
    host_home: Path, tmp_path: Path, monkeypatch
) -> None:
    fake = _bin(tmp_path, "docker", body=f"[ \"$1\" = pull ] && printf '{PULLED}'; exit 0")
    conn = LocalConn(host_home, fake)
    monkeypatch.setenv("VMRUN_REGISTRY_USER", "bob")
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    node = images.NodeImage(Request(parse_image(IMAGE)), RUNTIMES["docker"], 1000, 1000)

    class Steps(Progress):
        def __init__(self) -> None:
            self.seen: list[tuple[str, int, int | None]] = []

        def step(self, host: str, what: str, done: int, total: int | None) -> None:
            self.seen.append((what, done, total))

    steps, out = Steps(), Recorder()
    pulled = images.pull(conn, node, out, steps)  # type: ignore[arg-type]
    assert pulled.digest == "sha256:" + "cd" * 32
    assert steps.seen[-1][1:] == (2_000_000, 2_000_000)
    assert any("(1 layers, 2 MiB" in text for _, text in out.said), out.said
    assert not any("s3cret" in w for argv in conn.ran for w in argv)
    assert conn.envs[0] == {PASSWORD_ENV: "s3cret"}  # an env value: over stdin


def test_nodes_with_different_digests_are_refused() -> None:
    req = Request(parse_image(IMAGE))
    a = images.NodeImage(req, RUNTIMES["docker"], 1, 1, "sha256:" + "a" * 64)
    b = images.NodeImage(req, RUNTIMES["docker"], 1, 1, "sha256:" + "b" * 64)
    images.check_same_image({"h1": a, "h2": a})
    assert _code(images.check_same_image, {"h1": a, "h2": b}) == "images-differ"


def test_nodes_are_compared_by_image_id_and_named() -> None:
    """Two hosts' own builds (no registry digest) differ by ID: refused, the nodes named;
    the same ID with different digests (pulled from two mirrors) is one image."""
    req = Request(parse_image(IMAGE))
    ids = {
        h: images.NodeImage(req, RUNTIMES["docker"], 1, 1, None, f"sha256:{c * 64}")
        for h, c in (("h1", "1"), ("h2", "1"), ("h3", "2"))
    }
    with pytest.raises(VmrunError) as refused:
        images.check_same_image(ids)
    said = refused.value.one_line()
    assert refused.value.code == "images-differ" and "111111111111 on h1, h2" in said
    assert "222222222222 on h3" in said
    mirrors = {
        "h1": images.NodeImage(req, RUNTIMES["docker"], 1, 1, "sha256:" + "a" * 64, "i"),
        "h2": images.NodeImage(req, RUNTIMES["docker"], 1, 1, "sha256:" + "b" * 64, "i"),
    }
    images.check_same_image(mirrors)


# A stand-in docker: `image inspect` answers from $STATE/local (the host's own copy), `pull`
# as $STATE/registry says (ok, unreachable, denied), each call counted in $STATE/calls.
FAKE_DOCKER = """echo "$1" >> {state}/calls
case $1 in
  image) if [ -f {state}/local ]; then cat {state}/local; else exit 1; fi ;;
  pull)
    case $(cat {state}/registry) in
      ok) printf 'Digest: sha256:%s\\nStatus: Downloaded newer image\\n' {digest}
          echo sha256:fresh > {state}/local ;;
      unreachable) echo 'Error response from daemon: Get "https://reg/v2/": dial tcp:'\
' lookup reg: no such host' >&2; exit 1 ;;
      denied) echo 'Error response from daemon: unauthorized: authentication required' >&2
              exit 1 ;;
    esac ;;
esac
"""


@pytest.mark.parametrize(
    ("policy", "local", "registry", "outcome"),
    [
        ("newer", True, "unreachable", "kept"),  # air-gapped: the host's own copy
        ("newer", True, "ok", "fresh"),
        ("newer", False, "unreachable", "registry-unreachable"),
        ("newer", True, "denied", "registry-auth-refused"),  # not a reason to keep it
        ("missing", True, "unreachable", "local"),  # not pulled at all
        ("missing", False, "ok", "fresh"),
        ("always", True, "unreachable", "registry-unreachable"),
        ("never", True, "ok", "local"),
        ("never", False, "ok", "image-not-here"),
    ],
)
def test_the_pull_policy(
    host_home: Path, tmp_path: Path, policy: str, local: bool, registry: str, outcome: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    if local:
        (state / "local").write_text("sha256:local\n")
    (state / "registry").write_text(registry)
    fake = _bin(tmp_path, "docker", body=FAKE_DOCKER.format(state=state, digest="cd" * 32))
    conn = LocalConn(host_home, fake)
    node = images.NodeImage(Request(parse_image(IMAGE), pull=policy), RUNTIMES["docker"], 1, 1)
    out = Recorder()
    if outcome in ("kept", "fresh", "local"):
        pulled = images.pull(conn, node, out)  # type: ignore[arg-type]
        assert (
            pulled.image_id
            == {"kept": "sha256:local", "local": "sha256:local", "fresh": "sha256:fresh"}[outcome]
        )
        said = " ".join(text for _, text in out.said)
        pulls = (state / "calls").read_text().split().count("pull")
        assert pulls == (0 if outcome == "local" else 1), said
        assert ("kept this host's own" in said) == (outcome == "kept"), said
    else:
        assert _code(images.pull, conn, node, out) == outcome


def test_a_bad_pull_policy_is_refused() -> None:
    assert _code(Asked("a/b:1", pull="sometimes").check) == "bad-pull"
    assert _code(Asked("a/b:1", defaults={"pull": "maybe"}).check) == "bad-pull"
    assert Asked("a/b:1", defaults={"pull": "never"}).resolve({"pull": "missing"}).pull == "missing"
    assert Asked("a/b:1", pull="always").resolve({"pull": "missing"}).pull == "always"


# -- the node's container -------------------------------------------------------------------------


def test_the_nodes_process_is_the_runner_with_the_runs_folders_mounted() -> None:
    node = images.NodeImage(
        Request(
            parse_image(IMAGE),
            (parse_mount("/scratch:/home/u/vmrun/p"), parse_mount("/data:/data:ro")),
        ),
        RUNTIMES["docker"],
        1000,
        1001,
    )
    argv = images.container_argv(
        node,
        ["python3", "-m", "torch.distributed.run", "train.py"],
        ["NCCL_SOCKET_IFNAME"],
        home="/home/u",
        workdir="vmrun/p",
        record=".vmrun/runs/r1",
        run_id="r1",
        index=1,
        gpus=True,
    )
    assert argv[1].endswith("container_run.sh")
    docker, name, grace = argv[2:5]
    assert (docker, name, int(grace)) == ("docker", "vmrun-r1-1", images.GRACE)
    words = argv[5:]
    volumes = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
    assert "/home/u/vmrun/p:/home/u/vmrun/p" in volumes  # the project at its own path
    assert "/home/u/.vmrun/runs/r1:/home/u/.vmrun/runs/r1" in volumes  # torchrun's files
    assert "/home/u/.vmrun/lib:/home/u/.vmrun/lib:ro" in volumes  # the template, read-only
    assert "/data:/data:ro" in volumes
    assert "/scratch:/home/u/vmrun/p" not in volumes  # the project's place is the project's
    envs = [words[i + 1] for i, w in enumerate(words) if w == "-e"]
    assert "HOME=/home/u/.vmrun/container-home" in envs
    assert {"VMRUN_RUN_ID", "VMRUN_RUN_DIR", "NCCL_SOCKET_IFNAME"} <= set(envs)
    assert words[words.index("--user") + 1] == "1000:1001"
    assert words[words.index("--gpus") + 1] == "all"
    assert words[-4:] == ["python3", "-m", "torch.distributed.run", "train.py"]


def test_local_image_without_an_engine_here_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch
) -> None:
    from vmrun.operations.train import RunOptions, train

    monkeypatch.setenv("PATH", str(_tools(tmp_path)))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    run = RunOptions(image=IMAGE, epochs=1)
    assert _code(train, run, local=True) == "container-runtime-missing"
    assert not (tmp_path / "results").exists()
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", f"{_bin(tmp_path, 'docker')}:{_tools(tmp_path)}")
    missing = RunOptions(image=IMAGE, mounts=["/no/such:/data"], epochs=1)
    assert _code(train, missing, local=True) == "mount-source-missing"
