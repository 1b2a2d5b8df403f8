"""The container layer (vmrun.containers): image references and mounts checked as the
runtimes read them, each runtime's argv as a value, pull output read into progress and its
failures into codes, and vmrun/hostside/container_run.sh run here against a fake `docker`
that records its argv and plays run/stop/inspect/rm."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vmrun.containers.image import ImageRef, Mount, SifImage, parse_image, parse_mount
from vmrun.containers.pull import PullReader, pull_error, read_pull
from vmrun.containers.runtime import (
    RUNTIMES,
    ContainerSpec,
    check,
    detect,
    digest_argv,
    login_argv,
    parse_digest,
    ps_argv,
    require_present,
    run_argv,
    runtime_named,
    script_args,
    slurm_container,
)
from vmrun.errors import VmrunError, exit_code_for

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
SHA = "sha256:" + "ab" * 32


def _code(fn, *args) -> str:
    with pytest.raises(VmrunError) as caught:
        fn(*args)
    return caught.value.code


# -- image references ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "registry", "path", "tag", "digest"),
    [
        (NGC, "nvcr.io", "nvidia/pytorch", "24.05-py3", None),
        ("nersc/pytorch:ngc-23.07-v0", None, "nersc/pytorch", "ngc-23.07-v0", None),
        ("python", None, "python", None, None),
        ("localhost:5000/bed/torch:1", "localhost:5000", "bed/torch", "1", None),
        ("10.0.0.1:5000/torch", "10.0.0.1:5000", "torch", None, None),
        (f"ghcr.io/a/b_c/d--e@{SHA}", "ghcr.io", "a/b_c/d--e", None, SHA),
        (f"docker://{NGC}@{SHA}", "nvcr.io", "nvidia/pytorch", "24.05-py3", SHA),
    ],
)
def test_a_reference_splits_as_docker_reads_it(text, registry, path, tag, digest) -> None:
    assert parse_image(text) == ImageRef(registry, path, tag, digest)


def test_the_forms_each_runtime_is_given() -> None:
    ngc = parse_image(NGC)
    assert isinstance(ngc, ImageRef) and str(ngc) == NGC
    assert ngc.enroot() == "nvcr.io#nvidia/pytorch:24.05-py3"  # pyxis' REGISTRY#PATH
    assert ngc.docker_uri() == f"docker://{NGC}"
    hub = parse_image("python:3.12")
    assert isinstance(hub, ImageRef) and hub.repository == "library/python"
    assert hub.enroot() == "python:3.12" and hub.domain == "docker.io"
    assert parse_image("/shared/images/pytorch.sif") == SifImage("/shared/images/pytorch.sif")


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        ("nvcr.io/NVIDIA/pytorch:24.05", "lowercase"),
        ("nvcr.io/nvidia/pytorch:.24", "tag"),
        ("nvcr.io/nvidia/pytorch:" + "x" * 129, "tag"),
        ("nvcr.io/nvidia//pytorch", "path component"),
        ("nvcr.io/nvidia/-pytorch", "path component"),
        ("nvcr.io/nvidia/pytorch@sha256:abc", "digest"),
        (f"nvcr.io/nvidia/pytorch@sha256:{'ab' * 40}", "64 hex"),
        ("nvcr.io/nvidia/pytorch:24.05 -py3", "spaces"),
        ("", "empty"),
        ("oras://x/y", "docker://"),
        ("bad_host.io:x/y", "registry host"),
        ("nvcr.io/", "no image name"),
    ],
)
def test_a_malformed_reference_is_bad_image_naming_the_part(text: str, fact: str) -> None:
    with pytest.raises(VmrunError) as caught:
        parse_image(text)
    err = caught.value
    assert err.code == "bad-image" and exit_code_for(err) == 2
    assert fact in err.one_line() and "\n" not in err.one_line()


# -- mounts ----------------------------------------------------------------------------------


def test_mounts_parse_with_their_mode() -> None:
    assert parse_mount("/data:/data") == Mount("/data", "/data", False)
    assert parse_mount("/data/:/mnt/in:ro") == Mount("/data", "/mnt/in", True)
    assert str(parse_mount("/d:/e:ro")) == "/d:/e:ro" and str(parse_mount("/d:/e:rw")) == "/d:/e"


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        ("data:/data", "absolute"),
        ("/data:data", "absolute"),
        ("/data", "SRC:DST"),
        ("/a:/b:/c:ro", "SRC:DST"),
        ("/data:/data:rx", "mode"),
        ("/a,b:/data", "comma"),
        ("/data:/", "cannot be /"),
        ("/data:/x/../..", "cannot be /"),
    ],
)
def test_a_malformed_mount_is_bad_mount(text: str, fact: str) -> None:
    with pytest.raises(VmrunError) as caught:
        parse_mount(text)
    assert caught.value.code == "bad-mount" and fact in caught.value.one_line()


def test_a_missing_mount_source_is_refused_naming_the_host() -> None:
    from vmrun.containers.image import check_mount_sources

    mounts = [parse_mount("/data:/data"), parse_mount("/scratch:/s")]
    check_mount_sources(mounts, frozenset(), host="h1")
    with pytest.raises(VmrunError) as caught:
        check_mount_sources(mounts, {"/scratch"}, host="h1")
    assert caught.value.code == "mount-source-missing"
    assert caught.value.one_line().startswith("h1: --mount /scratch:/s")


def test_the_mount_probe_prints_the_missing_sources(tmp_path: Path) -> None:
    from vmrun.containers.image import MOUNT_PROBE, check_mount_sources, mount_probe_args
    from vmrun.hostside import source

    (tmp_path / "data").mkdir()
    mounts = [parse_mount(f"{tmp_path}/data:/data"), parse_mount(f"{tmp_path}/gone dir:/g:ro")]
    argv = ["sh", "-c", source(MOUNT_PROBE), "vmrun-container-mounts", *mount_probe_args(mounts)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    missing = set(done.stdout.splitlines())
    assert missing == {f"{tmp_path}/gone dir"}
    assert _code(check_mount_sources, mounts, missing) == "mount-source-missing"


# -- runtimes --------------------------------------------------------------------------------


def _spec(**kw) -> ContainerSpec:
    base = {
        "image": parse_image(NGC),
        "command": ("torchrun", "--nproc-per-node=2", "train.py"),
        "workdir": "/home/u/vmrun/proj-1a2b",
        "run_id": "20261125-184500",
        "node": 1,
        "uid": 1000,
        "gid": 1001,
    }
    return ContainerSpec(**{**base, **kw})


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def test_docker_run_has_what_ngc_documents_for_multi_node() -> None:
    spec = _spec(mounts=(parse_mount("/data:/data:ro"),), env=("NCCL_DEBUG", "WANDB_API_KEY"))
    argv = run_argv(RUNTIMES["docker"], spec)
    assert argv[:4] == ["docker", "run", "--name", "vmrun-20261125-184500-1"]
    assert "--rm" not in argv  # kept until its exit status is read
    for flag in ("--init", "--net=host", "--ipc=host"):
        assert flag in argv
    assert _pairs(argv, "--ulimit") == ["memlock=-1", "stack=67108864"]
    assert _pairs(argv, "--user") == ["1000:1001"]
    work = "/home/u/vmrun/proj-1a2b"
    assert _pairs(argv, "-v") == [f"{work}:{work}", "/data:/data:ro"]
    assert _pairs(argv, "-w") == ["/home/u/vmrun/proj-1a2b"]
    assert _pairs(argv, "--label") == ["vmrun.run=20261125-184500", "vmrun.node=1"]
    # variables by name only: values stay in the client's environment, off the command line
    assert _pairs(argv, "-e") == ["VMRUN_RUN_ID", "NCCL_DEBUG", "WANDB_API_KEY"]
    assert "--gpus" not in argv  # no GPU on the host
    assert argv[-4:] == [NGC, "torchrun", "--nproc-per-node=2", "train.py"]


def test_the_gpus_flag_only_where_the_host_has_nvidia_gpus() -> None:
    assert _pairs(run_argv(RUNTIMES["docker"], _spec(gpus=True)), "--gpus") == ["all"]
    podman = run_argv(RUNTIMES["podman"], _spec(gpus=True))
    assert podman[0] == "podman" and _pairs(podman, "--device") == ["nvidia.com/gpu=all"]


def test_the_limits_can_be_given_where_memlock_cannot_be_raised() -> None:
    argv = run_argv(RUNTIMES["docker"], _spec(ulimits=("stack=67108864",)))
    assert _pairs(argv, "--ulimit") == ["stack=67108864"]


def test_home_inside_is_set_only_when_given() -> None:
    assert "HOME=/w/.home" in run_argv(RUNTIMES["docker"], _spec(home="/w/.home"))
    assert not any(w.startswith("HOME=") for w in run_argv(RUNTIMES["docker"], _spec()))


def test_rootless_podman_keeps_the_users_id_and_the_hosts_limits() -> None:
    argv = run_argv(RUNTIMES["podman"], _spec(rootless=True))
    assert "--userns=keep-id" in argv and "--user" not in argv
    assert _pairs(argv, "--ulimit") == ["host"]


def test_podman_with_the_hosts_ipc_needs_no_dev_mqueue_on_the_host() -> None:
    """podman's --ipc=host binds /dev/mqueue, which a host without systemd lacks."""
    argv = run_argv(RUNTIMES["podman"], _spec(rootless=True))
    assert "--ipc=host" in argv
    assert _pairs(argv, "--mount") == ["type=tmpfs,destination=/dev/mqueue"]
    assert "--mount" not in run_argv(RUNTIMES["docker"], _spec())


def test_the_scripts_arguments_and_the_other_verbs() -> None:
    docker = RUNTIMES["docker"]
    spec = _spec()
    args = script_args(docker, spec, 20)
    assert args[:3] == ["docker", "vmrun-20261125-184500-1", "20"]
    assert args[3:] == run_argv(docker, spec)[4:]  # `run` and `--name` are the script's
    ngc = parse_image(NGC)
    assert isinstance(ngc, ImageRef)
    assert login_argv(docker, "nvcr.io", "$oauthtoken")[-2:] == ["--password-stdin", "nvcr.io"]
    assert digest_argv(docker, ngc)[-1] == NGC
    assert "label=vmrun.run=r1" in ps_argv(docker, "r1")


def test_the_digest_pulled_is_read_from_the_repo_digests() -> None:
    ngc = parse_image(NGC)
    hub = parse_image("python:3.12")
    assert isinstance(ngc, ImageRef) and isinstance(hub, ImageRef)
    assert parse_digest(f'["nvcr.io/nvidia/pytorch@{SHA}"]\n', ngc) == SHA
    assert parse_digest(f'["python@{SHA}"]', hub) == SHA
    assert parse_digest(f'["other/image@{SHA}"]', ngc) is None
    assert parse_digest("[]", ngc) is None and parse_digest("not json", ngc) is None


def test_the_slurm_runtimes_as_values() -> None:
    spec = _spec(mounts=(parse_mount("/data:/data"),), gpus=True)
    pyxis = slurm_container(RUNTIMES["pyxis"], spec)
    assert pyxis.srun == (
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/home/u/vmrun/proj-1a2b:/home/u/vmrun/proj-1a2b,/data:/data",
        "--container-workdir=/home/u/vmrun/proj-1a2b",
        "--container-name=vmrun-20261125-184500",
    )
    assert pyxis.prefix == () and pyxis.directives == ()
    apptainer = slurm_container(RUNTIMES["apptainer"], spec)
    assert apptainer.prefix[:3] == ("apptainer", "exec", "--nv")
    assert apptainer.prefix[-1] == f"docker://{NGC}"
    assert "--bind" in apptainer.prefix and "/data:/data" in apptainer.prefix[4]
    sif = slurm_container(RUNTIMES["apptainer"], _spec(image=parse_image("/img/pt.sif")))
    assert sif.prefix[-1] == "/img/pt.sif" and "--nv" not in sif.prefix
    nersc = parse_image("nersc/pytorch:ngc-23.07-v0")
    shifter = slurm_container(RUNTIMES["shifter"], _spec(image=nersc))
    assert shifter.directives == ("--image=docker:nersc/pytorch:ngc-23.07-v0",)
    assert shifter.prefix == ("shifter",)
    engine = slurm_container(RUNTIMES["podman"], spec, grace=15)
    assert engine.runner == "container_run.sh"
    base = spec.name.rsplit("-", 1)[0]  # the job script adds each task's -$SLURM_PROCID
    assert engine.prefix[:3] == ("podman", base, "15") and engine.prefix[-1] == NGC
    assert not any(w.startswith("vmrun.node=") for w in engine.prefix)


@pytest.mark.parametrize(
    ("runtime", "where", "image", "mount", "fact"),
    [
        ("pyxis", "hosts", NGC, None, "only inside Slurm"),
        ("apptainer", "hosts", NGC, None, "only inside Slurm"),
        ("docker", "hosts", "/img/pt.sif", None, ".sif"),
        ("pyxis", "slurm", "/img/pt.sif", None, ".sif"),
        ("shifter", "slurm", NGC, "/data:/data:ro", "read-write"),
    ],
)
def test_the_refusal_rules(runtime, where, image, mount, fact) -> None:
    mounts = (parse_mount(mount),) if mount else ()
    with pytest.raises(VmrunError) as caught:
        check(RUNTIMES[runtime], _spec(image=parse_image(image), mounts=mounts), where)
    assert caught.value.code == "container-option-unsupported" and fact in str(caught.value)
    assert exit_code_for(caught.value) == 2


def test_every_runtime_passes_a_plain_request_where_it_runs() -> None:
    for runtime in RUNTIMES.values():
        for where in runtime.where:
            check(runtime, _spec(), where)


def test_the_detect_script_names_the_runtimes_on_the_path(tmp_path: Path) -> None:
    from vmrun.containers.runtime import DETECT_SCRIPT
    from vmrun.hostside import source

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    programs = {
        "srun": "echo '  --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH'",
        "podman": "exit 0",
        "grep": 'exec /bin/grep "$@"',
    }
    for name, body in programs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir)}
    done = subprocess.run(
        ["/bin/sh", "-c", source(DETECT_SCRIPT), "vmrun-container-detect"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["pyxis", "podman"]
    assert detect(done.stdout.split()) == RUNTIMES["pyxis"]
    (bin_dir / "srun").write_text("#!/bin/sh\necho '  --nodes=N'\n")  # srun without pyxis
    done = subprocess.run(
        ["/bin/sh", "-c", source(DETECT_SCRIPT), "vmrun-container-detect"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["podman"]


def test_runtime_names_detection_and_presence() -> None:
    assert runtime_named("apptainer").binary == "apptainer"
    assert _code(runtime_named, "singularity") == "bad-config"
    assert detect({"docker", "apptainer"}) == RUNTIMES["apptainer"]  # the site's own first
    assert detect({"docker"}) == RUNTIMES["docker"] and detect(()) is None
    require_present(RUNTIMES["docker"], True, "h1")
    with pytest.raises(VmrunError) as caught:
        require_present(RUNTIMES["docker"], False, "h1")
    assert caught.value.code == "container-runtime-missing"
    assert "setup --container docker" in str(caught.value)


# -- pull output -----------------------------------------------------------------------------
PLAIN_PULL = f"""\
24.05-py3: Pulling from nvidia/pytorch
4f4fb700ef54: Already exists
fb0b3276a519: Pulling fs layer
2416db5e3ba6: Pulling fs layer
2ba01ce48f03: Pulling fs layer
2416db5e3ba6: Waiting
fb0b3276a519: Verifying Checksum
fb0b3276a519: Download complete
2ba01ce48f03: Download complete
fb0b3276a519: Pull complete
2ba01ce48f03: Pull complete
2416db5e3ba6: Verifying Checksum
2416db5e3ba6: Download complete
2416db5e3ba6: Pull complete
Digest: {SHA}
Status: Downloaded newer image for nvcr.io/nvidia/pytorch:24.05-py3
nvcr.io/nvidia/pytorch:24.05-py3
"""


def test_plain_pull_lines_count_layers_and_end_with_the_digest() -> None:
    reader = PullReader()
    lines = PLAIN_PULL.splitlines()
    for line in lines[:6]:
        reader.feed(line)
    midway = reader.progress()
    assert (midway.layers_total, midway.layers_done) == (4, 1)
    assert midway.bytes_done is None  # a pipe's output has no byte counts
    end = read_pull(PLAIN_PULL)
    assert (end.layers_total, end.layers_done, end.layers_downloaded) == (4, 4, 4)
    assert end.digest == SHA and end.up_to_date is False


def test_a_second_pull_is_up_to_date() -> None:
    again = read_pull(
        f"24.05-py3: Pulling from nvidia/pytorch\nDigest: {SHA}\n"
        "Status: Image is up to date for nvcr.io/nvidia/pytorch:24.05-py3\n"
        "nvcr.io/nvidia/pytorch:24.05-py3\n"
    )
    assert again.up_to_date is True and again.layers_total == 0


def test_the_engine_json_stream_carries_bytes() -> None:
    stream = [
        '{"status":"Pulling from nvidia/pytorch","id":"24.05-py3"}',
        '{"status":"Pulling fs layer","progressDetail":{},"id":"fb0b3276a519"}',
        '{"status":"Pulling fs layer","progressDetail":{},"id":"2416db5e3ba6"}',
        '{"status":"Downloading","progressDetail":{"current":1048576,"total":4194304},'
        '"progress":"[=>  ]","id":"fb0b3276a519"}',
        '{"status":"Downloading","progressDetail":{"current":524288,"total":2097152},'
        '"id":"2416db5e3ba6"}',
    ]
    reader = PullReader()
    for line in stream:
        reader.feed(line)
    now = reader.progress()
    assert (now.bytes_done, now.bytes_total) == (1572864, 6291456)
    reader.feed('{"status":"Download complete","progressDetail":{},"id":"fb0b3276a519"}')
    reader.feed('{"status":"Pull complete","progressDetail":{},"id":"fb0b3276a519"}')
    reader.feed(f'{{"status":"Digest: {SHA}"}}')
    done = reader.progress()
    assert done.bytes_done == 4194304 + 524288 and done.layers_done == 1 and done.digest == SHA
    reader.feed('{"errorDetail":{"message":"no space left on device"},"error":"no space left"}')
    assert reader.errors == ["no space left"]


# Recorded from Debian's docker.io 20.10 (client 28.2) pulling from Debian's docker-registry
# on 127.0.0.1: a pipe's output, then the Engine API's stream for the same pull.
RECORDED_DIGEST = "sha256:b3510a8adad8b3fda066ca147951c5f0c717ad5d97b6f0182f367a9ef134840f"
RECORDED_PLAIN = f"""\
1: Pulling from vmrun/tiny
ec6902b8aa6f: Pulling fs layer
ec6902b8aa6f: Verifying Checksum
ec6902b8aa6f: Download complete
ec6902b8aa6f: Pull complete
Digest: {RECORDED_DIGEST}
Status: Downloaded newer image for localhost:5077/vmrun/tiny:1
localhost:5077/vmrun/tiny:1
"""
_BAR = "[=\\u003e                                                 ]"
RECORDED_API = f"""\
{{"status":"Pulling from vmrun/tiny","id":"1"}}
{{"status":"Pulling fs layer","progressDetail":{{}},"id":"ec6902b8aa6f"}}
{{"status":"Downloading","progressDetail":{{"current":36445,"total":1149753}},\
"progress":"{_BAR}  36.45kB/1.15MB","id":"ec6902b8aa6f"}}
{{"status":"Download complete","progressDetail":{{}},"id":"ec6902b8aa6f"}}
{{"status":"Extracting","progressDetail":{{"current":32768,"total":1149753}},\
"progress":"{_BAR}  32.77kB/1.15MB","id":"ec6902b8aa6f"}}
{{"status":"Pull complete","progressDetail":{{}},"id":"ec6902b8aa6f"}}
{{"status":"Digest: {RECORDED_DIGEST}"}}
{{"status":"Status: Downloaded newer image for localhost:5077/vmrun/tiny:1"}}
"""


def test_a_recorded_pull_reads_the_same_from_a_pipe_and_from_the_api() -> None:
    plain, api = read_pull(RECORDED_PLAIN), read_pull(RECORDED_API)
    for seen in (plain, api):
        assert (seen.layers_total, seen.layers_done) == (1, 1)
        assert seen.digest == RECORDED_DIGEST and seen.up_to_date is False
    assert plain.bytes_total is None and api.bytes_done == api.bytes_total == 1149753
    reader = PullReader()
    for line in RECORDED_API.splitlines()[:3]:
        reader.feed(line)
    assert reader.progress().bytes_done == 36445


def test_a_refused_api_pull_is_its_error() -> None:
    reader = PullReader()
    reader.feed(
        '{"message":"manifest for localhost:5077/vmrun/tiny:9 not found: manifest '
        'unknown: manifest unknown"}'
    )
    assert pull_error("\n".join(reader.errors), "localhost:5077/vmrun/tiny:9").code == (
        "image-not-found"
    )


def test_podman_blob_lines_count_too() -> None:
    out = read_pull(
        "Trying to pull docker.io/library/python:3.12...\nGetting image source signatures\n"
        f"Copying blob sha256:{'1' * 64}\nCopying blob {'2' * 12} skipped: already exists\n"
        f"Copying blob sha256:{'1' * 64} done   |\nCopying config {'3' * 12} done   |\n"
        "Writing manifest to image destination\n"
    )
    assert (out.layers_total, out.layers_done) == (2, 2)


# Recorded from Debian's podman 4.3 (rootless, runc) pulling the same kind of image from
# Debian's docker-registry, through container_pull.sh (a terminal 200 columns wide).
RECORDED_PODMAN_TTY = """\
Trying to pull 10.77.0.2:5000/tiny:1...
Getting image source signatures
Copying blob 2fec26bb3f76 [=========>----------------------------] 400.0KiB / 1.5MiB
Copying blob 2fec26bb3f76 [======================================] 1.5MiB / 1.5MiB
Copying blob 2fec26bb3f76 done
Copying config 36e3c566f1 [======================================] 428.0b / 428.0b
Copying config 36e3c566f1 done
Writing manifest to image destination
Storing signatures
36e3c566f127b14ff21d8c5dc40a8290b5307daadd918d4f4e79e4373ffbf11a
"""
RECORDED_PODMAN_AGAIN = """\
Trying to pull 10.77.0.2:5000/tiny:1...
Getting image source signatures
Copying blob 2fec26bb3f76 .
Copying blob 2fec26bb3f76 skipped: already exists
Copying config 36e3c566f1 done
Writing manifest to image destination
"""


def test_podmans_terminal_bars_give_the_bytes_and_a_second_pull_is_there_already() -> None:
    reader = PullReader()
    for line in RECORDED_PODMAN_TTY.splitlines()[:3]:
        reader.feed(line)
    assert reader.progress().bytes_done == 400 * 1024  # mid-pull, from the bar
    done = read_pull(RECORDED_PODMAN_TTY)
    assert (done.layers_total, done.layers_done) == (1, 1)  # the config is no layer
    assert done.bytes_total == round(1.5 * 2**20) and done.up_to_date is False
    again = read_pull(RECORDED_PODMAN_AGAIN)
    assert again.layers_done == 1 and again.up_to_date is True


def test_the_pull_runs_on_a_terminal_wide_enough_for_podmans_bars(tmp_path: Path) -> None:
    """script(1)'s terminal has no width here; podman cuts every bar to "…" on it."""
    from vmrun.hostside import source

    if shutil.which("script") is None or shutil.which("stty") is None:
        pytest.skip("script(1) or stty missing")
    fake = tmp_path / "podman"
    bar = "Copying blob 2fec26bb3f76 [====] 1.5MiB / 1.5MiB"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = pull ] || exit 1\nset -- $(stty size)\necho "{bar} (cols $2)"\n'
    )
    fake.chmod(0o755)
    argv = ["sh", "-c", source("container_pull.sh"), "vmrun-container-pull", str(fake), "x:1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    cols = int(done.stdout.rsplit("cols ", 1)[1].split(")")[0])
    assert cols >= 120 and read_pull(done.stdout).bytes_total == round(1.5 * 2**20)


@pytest.mark.parametrize(
    ("stderr", "code"),
    [
        (
            "Error response from daemon: manifest for nvcr.io/nvidia/pytorch:99.99-py3 not "
            "found: manifest unknown: manifest unknown",
            "image-not-found",
        ),
        (
            "Error response from daemon: pull access denied for nosuch/image, repository does "
            "not exist or may require 'docker login': denied: requested access to the resource "
            "is denied",
            "image-not-found",
        ),
        (
            "Error: initializing source docker://quay.io/x/y:1: reading manifest 1 in "
            "quay.io/x/y: manifest unknown",
            "image-not-found",
        ),
        (
            'Error response from daemon: Head "https://nvcr.io/v2/nvidia/private/manifests/1": '
            "unauthorized: authentication required",
            "registry-auth-refused",
        ),
        (
            'Error response from daemon: Get "https://localhost:5000/v2/": unauthorized: '
            "incorrect username or password",
            "registry-auth-refused",
        ),
        (
            "failed to register layer: write /usr/lib/x86_64-linux-gnu/libcudnn.so.9: no space "
            "left on device",
            "no-space-left",
        ),
        (
            'Error response from daemon: Get "https://nvcr.io/v2/": dial tcp: lookup nvcr.io on '
            "127.0.0.53:53: server misbehaving",
            "registry-unreachable",
        ),
        (
            'Error response from daemon: Get "https://10.0.0.1:5000/v2/": http: server gave '
            "HTTP response to HTTPS client",
            "registry-unreachable",
        ),
        (
            "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
            "daemon running?",
            "container-runtime-unavailable",
        ),
        (
            "permission denied while trying to connect to the Docker daemon socket at "
            'unix:///var/run/docker.sock: Head "http://%2Fvar%2Frun%2Fdocker.sock/_ping"',
            "container-runtime-unavailable",
        ),
        (  # recorded, as the three below
            'Error response from daemon: Get "http://localhost:5078/v2/": dial tcp '
            "127.0.0.1:5078: connect: connection refused",
            "registry-unreachable",
        ),
        (
            "Error response from daemon: manifest for localhost:5077/vmrun/tiny:9 not found: "
            "manifest unknown: manifest unknown",
            "image-not-found",
        ),
        ("invalid reference format: repository name (vmrun/Tiny) must be lowercase", "bad-image"),
        ("sh: 1: docker: not found", "container-runtime-missing"),
        ("invalid reference format: repository name must be lowercase", "bad-image"),
        ("Error response from daemon: something new", "pull-failed"),
    ],
)
def test_a_failed_pull_is_one_line_with_its_code(stderr: str, code: str) -> None:
    err = pull_error(stderr + "\n", NGC, host="h1")
    assert err.code == code
    line = err.one_line()
    assert line.startswith("h1: ") and "\n" not in line and len(line) < 500


# -- container_run.sh, against a fake docker ----------------------------------------------------
FAKE_DOCKER = r"""#!/bin/sh
# A stand-in for docker: logs each call's argv (fields split by US), plays one container.
st=$FAKE_DOCKER_STATE
{ printf '%s\037' "$@"; echo; } >> "$st/log"
verb=$1; shift
case $verb in
  rm) if [ -e "$st/exists" ]; then echo removed >> "$st/log"; fi
      rm -f "$st/exists" "$st/code" "$st/error" ;;
  run) touch "$st/exists"; echo $$ > "$st/run.pid"
       case $FAKE_RUN in
         exit:*) echo "${FAKE_RUN#exit:}" > "$st/code"; exit "${FAKE_RUN#exit:}" ;;
         refuse) rm -f "$st/exists"; echo "docker: invalid reference format." >&2; exit 125 ;;
         startfail) echo 128 > "$st/code"; echo "error setting rlimits" > "$st/error"
                    exit 125 ;;
         sleep) trap 'echo 143 > "$st/code"; kill "$sp" 2>/dev/null; exit 143' TERM
                sleep 30 & sp=$!; touch "$st/ready"; wait "$sp" ;;
       esac ;;
  stop) kill -TERM "$(cat "$st/run.pid")" ;;
  login) cat > "$st/login.stdin"; echo "$DOCKER_CONFIG" > "$st/login.conf"
         [ "$(cat "$st/login.stdin")" = "$FAKE_PASSWORD" ] || {
           echo 'Error response from daemon: Get "https://r/v2/": unauthorized: incorrect' \
             'username or password' >&2; exit 1; } ;;
  pull) echo "${DOCKER_CONFIG-}" > "$st/pull.conf"
        if [ -t 1 ]; then printf '%b' "${FAKE_PULL_TTY-$FAKE_PULL_OUT}"  # a terminal's bars
        else printf '%s' "$FAKE_PULL_OUT"; fi
        exit "${FAKE_PULL_EXIT:-0}" ;;
  inspect) [ -e "$st/exists" ] && [ -e "$st/code" ] || { echo "No such object" >&2; exit 1; }
           case $* in  # the fields the --format asks for
             *State.Error*) echo "$(cat "$st/code") $(cat "$st/error" 2>/dev/null)" ;;
             *) cat "$st/code" ;;
           esac ;;
esac
"""


@pytest.fixture
def fake_docker(tmp_path: Path) -> tuple[Path, Path]:
    state = tmp_path / "state"
    state.mkdir()
    binary = tmp_path / "bin" / "docker"
    binary.parent.mkdir()
    binary.write_text(FAKE_DOCKER)
    binary.chmod(0o755)
    return binary, state


def _script(fake: tuple[Path, Path], behaviour: str, *, stale: bool = False) -> subprocess.Popen:
    from vmrun.hostside import source

    binary, state = fake
    if stale:
        (state / "exists").touch()
    args = script_args(RUNTIMES["docker"], _spec(), 5)
    args[0] = str(binary)
    env = {**os.environ, "FAKE_DOCKER_STATE": str(state), "FAKE_RUN": behaviour}
    return subprocess.Popen(
        ["sh", "-c", source("container_run.sh"), "vmrun-container", *args], env=env
    )


def _calls(state: Path) -> list[list[str]]:
    lines = (state / "log").read_text().splitlines()
    return [line.split("\037")[:-1] if "\037" in line else [line] for line in lines]


@pytest.mark.parametrize("code", [0, 7])
def test_the_containers_exit_code_is_the_scripts(fake_docker, code: int) -> None:
    assert _script(fake_docker, f"exit:{code}").wait(timeout=20) == code
    calls = _calls(fake_docker[1])
    verbs = [c[0] for c in calls]
    assert verbs == ["rm", "run", "inspect", "rm", "removed"]  # its status read where it can be
    run = calls[1]
    name = "vmrun-20261125-184500-1"
    # --rm: the engine removes it even when this shell is killed before it could
    assert run[:4] == ["run", "--rm", "--name", name] and run[-1] == "train.py"
    assert calls[2][-1] == name and calls[3] == ["rm", "-f", name]


@pytest.mark.parametrize("behaviour", ["refuse", "startfail"])
def test_a_container_not_made_or_not_started_exits_with_the_clients_status(
    fake_docker, behaviour: str
) -> None:
    """125, not the engine's 128 for a container that never started (its State.Error)."""
    assert _script(fake_docker, behaviour).wait(timeout=20) == 125
    assert not (fake_docker[1] / "exists").exists()


def test_a_stale_container_of_the_same_name_is_removed_first(fake_docker) -> None:
    assert _script(fake_docker, "exit:0", stale=True).wait(timeout=20) == 0
    verbs = [c[0] for c in _calls(fake_docker[1])]
    assert verbs[:3] == ["rm", "removed", "run"]


def _sleeping(fake: tuple[Path, Path]) -> tuple[subprocess.Popen, Path]:
    """container_run.sh with a container that sleeps, once it runs."""
    proc = _script(fake, "sleep")
    state = fake[1]
    deadline = time.monotonic() + 15
    while not (state / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc, state


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_then_removes_the_container(fake_docker, sig) -> None:
    proc, state = _sleeping(fake_docker)
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == 143  # the container's own status: it got TERM
    calls = _calls(state)
    verbs = [c[0] for c in calls]
    assert verbs[-4:] == ["stop", "inspect", "rm", "removed"]
    assert calls[verbs.index("stop")][1:] == ["-t", "5", "vmrun-20261125-184500-1"]
    assert not (state / "exists").exists()  # no container left


def test_usr2_goes_to_every_process_in_the_container(fake_docker) -> None:
    """Slurm's time-limit warning reaches the step's processes, and the container's are not
    among them: the script passes it on to all of them (PID 1, the init, excepted)."""
    proc, state = _sleeping(fake_docker)
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 15
    while not any(c[0] == "exec" for c in _calls(state)):
        assert time.monotonic() < deadline and proc.poll() is None  # it lives on
        time.sleep(0.02)
    (forward,) = [c for c in _calls(state) if c[0] == "exec"]
    assert forward[1:3] == ["vmrun-20261125-184500-1", "sh"] and forward[-1].endswith("-- -1")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_container_run_is_shellcheck_clean_posix_sh() -> None:
    from vmrun.hostside import HERE

    done = subprocess.run(
        ["shellcheck", "-s", "sh", str(HERE / "container_run.sh")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout


def _pull(fake: tuple[Path, Path], username: str | None, password: str | None, **more: str):
    from vmrun.containers.runtime import PASSWORD_ENV, PULL_SCRIPT, pull_script_args
    from vmrun.hostside import source

    binary, state = fake
    image = parse_image("localhost:5077/vmrun/tiny:1")
    assert isinstance(image, ImageRef)
    args = pull_script_args(RUNTIMES["docker"], image, "always", username)
    args[0] = str(binary)
    env = {
        **os.environ,
        "FAKE_DOCKER_STATE": str(state),
        "FAKE_PULL_OUT": RECORDED_PLAIN,
        "FAKE_PASSWORD": "s3cret 'x'",
        "TMPDIR": str(state),
        **more,
    }
    env.pop(PASSWORD_ENV, None)
    if password is not None:
        env[PASSWORD_ENV] = password
    argv = ["sh", "-c", source(PULL_SCRIPT), "vmrun-container-pull", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20)


def test_a_pull_without_login_is_the_runtimes_pull(fake_docker) -> None:
    done = _pull(fake_docker, None, None)
    assert done.returncode == 0
    inspect = ["image", "inspect", "--format", "{{.Id}}", "localhost:5077/vmrun/tiny:1"]
    assert _calls(fake_docker[1]) == [inspect, ["pull", "localhost:5077/vmrun/tiny:1"], inspect]
    assert read_pull(done.stdout).digest == RECORDED_DIGEST


def test_the_password_goes_through_stdin_into_a_config_removed_after(fake_docker) -> None:
    state = fake_docker[1]
    done = _pull(fake_docker, "bob", "s3cret 'x'")
    assert done.returncode == 0, done.stderr
    calls = _calls(state)
    assert calls[1] == ["login", "--username", "bob", "--password-stdin", "localhost:5077"]
    assert [c[0] for c in calls] == ["image", "login", "pull", "image"]
    assert (state / "login.stdin").read_text() == "s3cret 'x'"
    assert not any("s3cret" in word for call in calls for word in call)
    conf = (state / "login.conf").read_text().strip()
    assert conf.startswith(str(state)) and (state / "pull.conf").read_text().strip() == conf
    assert not Path(conf).exists()  # no password left on the host


def test_a_refused_login_is_auth_refused_and_pulls_nothing(fake_docker) -> None:
    state = fake_docker[1]
    done = _pull(fake_docker, "bob", "wrong")
    assert done.returncode == 1
    assert pull_error(done.stderr, "localhost:5077/vmrun/tiny:1").code == "registry-auth-refused"
    assert [c[0] for c in _calls(state)] == ["image", "login"]
    assert not Path((state / "login.conf").read_text().strip()).exists()
    assert _pull(fake_docker, "bob", None).returncode == 2  # no password given


def test_ps_lines_read_as_names_and_states() -> None:
    from vmrun.containers.runtime import parse_ps

    out = "vmrun-r1-0 running\nvmrun-r1-1 exited\n\n"
    assert parse_ps(out) == [("vmrun-r1-0", "running"), ("vmrun-r1-1", "exited")]


# what `docker pull` writes on a terminal: bars with byte counts, redrawn in place
TTY_PULL = (
    "2.13.0: Pulling from vmrun-test/torch\\r\\n"
    "0123456789ab: Pulling fs layer\\r\\n"
    "ba9876543210: Pulling fs layer\\r\\n"
    "\\033[2A\\033[2K\\r0123456789ab: Downloading [=>      ]  1.049MB/2.097MB\\r\\033[2B"
    "\\033[1A\\033[2K\\rba9876543210: Downloading [=====>  ]  3MB/4MB\\r\\033[1B"
    "\\033[2A\\033[2K\\r0123456789ab: Pull complete\\r\\033[2B"
    "\\033[1A\\033[2K\\rba9876543210: Pull complete\\r\\033[1B"
    f"Digest: {RECORDED_DIGEST}\\r\\n"
    "Status: Downloaded newer image for localhost:5077/vmrun/tiny:1\\r\\n"
)


@pytest.mark.skipif(shutil.which("script") is None, reason="script(1) is not installed")
def test_a_pull_on_a_terminal_gives_its_byte_counts_as_plain_lines(fake_docker) -> None:
    done = _pull(fake_docker, None, None, FAKE_PULL_TTY=TTY_PULL)
    assert done.returncode == 0, done.stderr
    assert "\033" not in done.stdout and "\r" not in done.stdout
    got = read_pull(done.stdout)
    assert (got.layers_total, got.layers_done) == (2, 2)
    assert got.bytes_total == 2_097_000 + 4_000_000 and got.digest == RECORDED_DIGEST


@pytest.mark.skipif(shutil.which("script") is None, reason="script(1) is not installed")
def test_a_failed_pull_on_a_terminal_keeps_its_status(fake_docker) -> None:
    done = _pull(
        fake_docker, None, None, FAKE_PULL_TTY="Error: manifest unknown\\n", FAKE_PULL_EXIT="3"
    )
    assert done.returncode == 3
    assert pull_error(done.stdout, "x:1").code == "image-not-found"
    assert not list(fake_docker[1].glob("vmrun-pull-status.*"))  # its status file removed


# -- a container its runtime refused to start -------------------------------------------------

# what a run's log holds when the daemon may not raise NGC's memlock=-1 (docker 24, runc 1.1;
# an older runc; crun under podman)
RUNC = (
    b"docker: Error response from daemon: failed to create task for container: failed to"
    b" create shim task: OCI runtime create failed: runc create failed: unable to start"
    b" container process: error during container init: error setting rlimits for ready"
    b" process: error setting rlimit type 8: operation not permitted: unknown.\n"
)
OLD_RUNC = (
    b'container_linux.go:349: starting container process caused "process_linux.go:449:'
    b' container init caused \\"setting rlimits for ready process: error setting rlimit'
    b' type 3: operation not permitted\\"": unknown\n'
)
CRUN = b"Error: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied\n"


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        (RUNC, "memlock"),
        (OLD_RUNC, "stack"),
        (CRUN, "nofile"),
        (b"PermissionError: [Errno 1] Operation not permitted: 'x'\n", None),
        (b"docker: Error response from daemon: pull access denied\n", None),
    ],
)
def test_the_runtimes_refusal_of_a_limit_is_read_with_the_limits_name(
    text: bytes, limit: str | None
) -> None:
    from vmrun.containers.refusals import refused_limit

    assert refused_limit(text) == limit


def test_a_run_failed_after_the_refusal_is_container_rlimits_with_the_setting_that_fixes_it() -> (
    None
):
    from vmrun.containers.refusals import naming_refusals
    from vmrun.errors import CommandFailed, exit_code_for, run_failed
    from vmrun.reporting import Recorder

    said = Recorder()
    with pytest.raises(CommandFailed) as caught, naming_refusals(said) as watched:
        watched.output(b"[h1] " + RUNC)
        raise run_failed("r1", "exited with 125", 125, host="h1", hint="see logs")
    named = caught.value
    assert named.code == "container-rlimits" and exit_code_for(named) == 125
    assert "memlock" in named.message and "container_ulimits" in str(named.hint)
    assert said.data == b"[h1] " + RUNC  # the run's lines go on to the caller
    with pytest.raises(CommandFailed) as plain, naming_refusals(Recorder()) as watched:
        watched.output(b"Traceback (most recent call last):\n")
        raise run_failed("r1", "exited with 125", 125, host="h1")
    assert plain.value.code == "run-failed"
