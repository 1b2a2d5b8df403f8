"""Docker on test hosts: one real ``dockerd`` per host, a registry, and the test image.

* :class:`DockerDaemon`: Debian's ``dockerd`` (docker.io) inside a host's network
  namespace, with its own data root, exec root, pid file, config file and Unix socket
  (everything under ``<home root>/<prefix>/docker-<host>/``, so a crashed run's files go
  with the bed's prefix).  ``--iptables=false --bridge=none``: containers use host
  networking, and the machine's firewall is never touched.  Storage driver ``overlay2``
  (the kernel's overlayfs works on this ext4; no fuse-overlayfs needed); runtime ``runc``:
  on this kind of machine runc works and crun does not (it cannot set rlimits here, and
  refuses the hybrid cgroup layout).  No runtime can raise RLIMIT_MEMLOCK here:
  ``memlock_hard_limit()``.
  The host's user is put in the ``docker`` group (the socket's group) and gets a docker
  CLI context naming the socket, so ``docker ...`` over SSH reaches its host's daemon
  with no DOCKER_HOST.
* :class:`ImageRegistry`: Debian's ``docker-registry`` (distribution 2.8, plain http) in a
  host's namespace; the daemons are told ``--insecure-registry``.
* :func:`push_test_image`: the cached rootfs tarball (tests/testbed/docker_image.sh,
  built by .ci/run) through ``docker import``, a small build step and ``docker push``.
* :class:`DockerBed`: all three on hosts of a NetnsBed.

Why the cgroup mounts: ``ip netns exec`` remounts /sys for the new namespace, which hides
/sys/fs/cgroup; dockerd refuses to run containers without it.  The daemon's wrapper mounts
the machine's hierarchies again inside its own mount namespace (the one ``ip netns exec``
made), so nothing outside changes.  Containers go under a cgroup parent named after the
bed's prefix and host, removed on close().
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .cgroups import cgroup_mount_script, remove_cgroup_tree
from .errors import TestbedError
from .files import mkdir_shared, write_text
from .netns import NetnsBed
from .procs import kill_until_gone, pid_alive, wait_until
from .testhost import TestHost
from .tools import STD_PATH, _which

DOCKERD = _which("dockerd", "/usr/sbin/dockerd")
# Debian's client, the daemon's own version (the machine may have a newer one first on PATH)
DOCKER = "/usr/bin/docker"
DOCKER_REGISTRY = _which("docker-registry", "/usr/bin/docker-registry")
RUNC = _which("runc", "/usr/sbin/runc")
USERMOD = _which("usermod", "/usr/sbin/usermod")
DOCKER_GROUP = "docker"
# executables of the daemon's helpers, killed by pid on close() if still alive
HELPER_EXES = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc")

IMAGE_SCRIPT = Path(__file__).with_name("docker_image.sh")
IMAGE_CACHE_NAME = "docker-image-torch-2.13.0"
IMAGE_REPO = "vmrun-test/torch"
IMAGE_TAG = "2.13.0"


# --------------------------------------------------------------------------- the image


def image_stamp(wheelhouse: Path) -> str:
    """What the cached rootfs was built from: the recipe and the wheels' names."""
    h = hashlib.sha256(IMAGE_SCRIPT.read_bytes())
    for name in sorted(p.name for p in wheelhouse.glob("*.whl")):
        h.update(name.encode())
    return h.hexdigest()[:16]


def image_cache(cache: Path) -> Path:
    return cache / IMAGE_CACHE_NAME


def image_tarball(cache: Path) -> Path | None:
    """The cached rootfs tarball if it is there and current, else None."""
    target = image_cache(cache)
    wheelhouse = cache / "wheelhouse-torch-2.13.0"
    stamp = target / "stamp"
    if not (target / "rootfs.tar").is_file() or not stamp.is_file():
        return None
    if stamp.read_text().strip() != image_stamp(wheelhouse):
        return None
    return target / "rootfs.tar"


def build_image(cache: Path) -> Path:
    """Build the rootfs tarball into the cache unless present and current (needs network:
    .ci/run only).  Prints its size and how long it took."""
    if (tar := image_tarball(cache)) is not None:
        print(f"test image rootfs current: {tar} ({tar.stat().st_size / 2**20:.0f} MiB)")
        return tar
    wheelhouse = cache / "wheelhouse-torch-2.13.0"
    pip_wheels = sorted((cache / "wheelhouse-uv-pip").glob("pip-*.whl"))
    if not pip_wheels:
        raise TestbedError(f"no pip wheel in {cache / 'wheelhouse-uv-pip'}")
    started = time.monotonic()
    subprocess.run(
        [
            "sh",
            str(IMAGE_SCRIPT),
            str(wheelhouse),
            str(pip_wheels[-1]),
            str(image_cache(cache)),
            image_stamp(wheelhouse),
        ],
        check=True,
        timeout=1800,
    )
    tar = image_cache(cache) / "rootfs.tar"
    print(
        f"test image rootfs built in {time.monotonic() - started:.0f} s: {tar} "
        f"({tar.stat().st_size / 2**20:.0f} MiB)"
    )
    return tar


def memlock_hard_limit() -> int | None:
    """RLIMIT_MEMLOCK's hard limit in bytes (None: unlimited).  A container cannot get more
    (``--ulimit memlock=-1`` fails) where the machine's processes lack CAP_SYS_RESOURCE, as
    here (8 MiB): raising a hard limit needs it."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def skip_reason_no_docker(cache: Path) -> str | None:
    """Why the Docker bed cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for exe in (DOCKERD, DOCKER, DOCKER_REGISTRY, RUNC):
        if not os.access(exe, os.X_OK):
            return f"{exe} missing (apt-get install docker.io docker-registry)"
    try:
        grp.getgrnam(DOCKER_GROUP)
    except KeyError:
        return f"no {DOCKER_GROUP!r} group (docker.io creates it)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs (storage driver overlay2)"
    if image_tarball(cache) is None:
        return f"test image rootfs not built or outdated in {image_cache(cache)} (run .ci/run)"
    return None


# --------------------------------------------------------------------------- a daemon


def _retry(argv: list[str], what: str) -> None:
    """usermod and friends fail while another bed holds the /etc/group lock: retry."""
    env = {"PATH": STD_PATH, "LANG": "C.UTF-8"}
    for attempt in range(50):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        if proc.returncode == 0:
            return
        if attempt == 49:
            raise TestbedError(f"{what} failed: {proc.stderr.strip()}")
        time.sleep(0.05)


def _context_meta_dir(home: Path, name: str) -> Path:
    return home / ".docker" / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()


class DockerDaemon:
    """A real ``dockerd`` inside ``host`` (its netns, /etc overrides, hostname); returns
    once it answers on its socket.  ``insecure_registries``: "addr:port" it pulls from
    over plain http.  ``group``: the socket's group (name or gid); with the default,
    ``docker``, the host's user joins it and gets a CLI context naming the socket.  A
    context manager; close() is idempotent."""

    def __init__(
        self,
        host: TestHost,
        *,
        insecure_registries: Sequence[str] = (),
        storage_driver: str = "overlay2",
        group: str = DOCKER_GROUP,
        timeout: float = 60.0,
    ) -> None:
        self.host = host
        bed = host._bed
        self.root = bed.home_root / bed.prefix / f"docker-{host.name}"
        self.socket = self.root / "docker.sock"
        self.log = self.root / "dockerd.log"
        self.cgroup_parent = f"/{host.netns}-docker"
        self.storage_driver = storage_driver
        self.group = group
        self._insecure = list(insecure_registries)
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        started = time.monotonic()
        try:
            self._start(timeout)
            if group == DOCKER_GROUP:
                self._give_user_access()
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise
        self.started_in = time.monotonic() - started

    def __repr__(self) -> str:
        return f"DockerDaemon({self.host.name!r}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _argv(self) -> list[str]:
        argv = [
            DOCKERD,
            f"--config-file={self.root / 'daemon.json'}",  # not the machine's /etc/docker
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--host=unix://{self.socket}",
            f"--group={self.group}",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--userland-proxy=false",
            f"--storage-driver={self.storage_driver}",
            # runc, not crun: on this kind of machine crun does not work (crun 1.8: "cgroups in
            # hybrid mode not supported"; and it cannot set rlimits here either)
            "--default-runtime=runc",
            "--exec-opt=native.cgroupdriver=cgroupfs",
            f"--cgroup-parent={self.cgroup_parent}",
            "--shutdown-timeout=3",
        ]
        return argv + [f"--insecure-registry={r}" for r in self._insecure]

    def _start(self, timeout: float) -> None:
        if self.root.exists():
            raise TestbedError(f"{self.root} exists: one daemon per host")
        for d in (self.root, self.root / "data", self.root / "exec"):
            mkdir_shared(d, 0o711)
        write_text(self.root / "daemon.json", "{}\n")
        with open(self.log, "ab") as out:
            self._proc = self.host.popen(
                ["/bin/sh", "-c", cgroup_mount_script(), "dockerd", *self._argv()],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def answers() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise TestbedError(
                    f"dockerd on {self.host.name} exited rc={self._proc.returncode}\n"
                    + self.log_tail()
                )
            if not self.socket.exists():
                return False
            return (
                self.docker(
                    "version", "--format", "{{.Server.Version}}", timeout=10, check=False
                ).returncode
                == 0
            )

        try:
            wait_until(answers, timeout, f"dockerd on {self.host.name} to answer", 0.05)
        except TestbedError as exc:
            if str(exc).startswith("timed out"):
                raise TestbedError(f"{exc}\n{self.log_tail()}") from None
            raise

    def _give_user_access(self) -> None:
        """The docker group (the socket's group) and a CLI context that names the socket."""
        host = self.host
        _retry([USERMOD, "-aG", DOCKER_GROUP, host.user], f"usermod -aG docker {host.user}")
        meta = _context_meta_dir(host.home, "vmt")
        mkdir_shared(meta)
        endpoint = {"Host": f"unix://{self.socket}", "SkipTLSVerify": False}
        write_text(
            meta / "meta.json",
            json.dumps({"Name": "vmt", "Metadata": {}, "Endpoints": {"docker": endpoint}}),
        )
        write_text(host.home / ".docker" / "config.json", json.dumps({"currentContext": "vmt"}))
        for dirpath, dirs, files in os.walk(host.home / ".docker"):
            for p in [dirpath, *(os.path.join(dirpath, n) for n in dirs + files)]:
                os.chown(p, host.uid, host.gid)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return f"--- {self.log}\n" + self.log.read_text(errors="replace")[-chars:]
        return ""

    def docker(
        self, *args: str, timeout: float = 120, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The docker client as root against this daemon (from the root namespace: the
        daemon itself, inside the host, does the networking, e.g. a pull)."""
        argv = [DOCKER, "-H", f"unix://{self.socket}", *args]
        env = {
            "PATH": STD_PATH,
            "LANG": "C.UTF-8",
            "DOCKER_CONFIG": str(self.root / "client"),
            "DOCKER_BUILDKIT": "0",
        }
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout, input=input
        )
        if check and proc.returncode != 0:
            raise TestbedError(
                f"docker {' '.join(args)} on {self.host.name} failed (rc={proc.returncode}):\n"
                f"{proc.stderr.strip()}"
            )
        return proc

    def containers(self) -> list[str]:
        """Ids of every container the daemon has (running or not): ``docker ps -aq``."""
        return self.docker("ps", "-aq", "--no-trunc").stdout.split()

    def images(self) -> list[str]:
        """repo:tag of every image the daemon holds."""
        out = self.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        return out.split()

    def leftover_pids(self) -> list[int]:
        """The daemon's helpers in the host (by executable) and every process in the
        daemon's cgroup parent (its containers), wherever it runs."""
        found = set()
        for pid in self.host.pids():
            with contextlib.suppress(OSError):
                if os.path.basename(os.readlink(f"/proc/{pid}/exe")) in HELPER_EXES:
                    found.add(pid)
        needle = f":{self.cgroup_parent}/"
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in Path(f"/proc/{name}/cgroup").read_text() and pid_alive(int(name)):
                        found.add(int(name))
        if self._proc is not None and self._proc.poll() is None:
            found.add(self._proc.pid)
        return sorted(found)

    def close(self) -> None:
        """Remove every container, stop dockerd by pid (SIGKILL after its shutdown), kill
        what is left of it by pid, then remove its cgroups and files."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(Exception):
                if ids := self.containers():
                    self.docker("rm", "-f", *ids, timeout=30, check=False)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        kill_until_gone(self.leftover_pids)
        if left := remove_cgroup_tree(self.cgroup_parent):
            raise TestbedError(f"cgroups left by dockerd on {self.host.name}: {left}")
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.host.home / ".docker", ignore_errors=True)

    def __enter__(self) -> DockerDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the registry


class ImageRegistry:
    """Debian's ``docker-registry`` inside ``host``, plain http on ``host.addr:port``;
    returns once ``GET /v2/`` answers 200.  ``address`` is what image references start
    with."""

    def __init__(
        self, host: TestHost, *, port: int = 5000, timeout: float = 30.0, seed: Path | None = None
    ) -> None:
        self.host = host
        self._seed = seed  # a storage folder to start from (a copy: pushes must not reach it)
        bed = host._bed
        self.root = bed.home_root / bed.prefix / f"registry-{host.name}"
        self.address = f"{host.addr}:{port}"
        self.log = self.root / "registry.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        try:
            self._start(timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _start(self, timeout: float) -> None:
        if self._seed is not None:
            mkdir_shared(self.root, 0o700)
            subprocess.run(["cp", "-a", str(self._seed), str(self.root / "storage")], check=True)
        else:
            mkdir_shared(self.root / "storage", 0o700)
        config = self.root / "config.yml"
        write_text(
            config,
            "version: 0.1\n"
            "log:\n  level: info\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'storage'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n",
        )
        with open(self.log, "ab") as out:
            self._proc = self.host.popen(
                [DOCKER_REGISTRY, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT
            )

        def answers() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise TestbedError(
                    f"docker-registry exited rc={self._proc.returncode}\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            return self.get("/v2/")[0] == 200

        wait_until(answers, timeout, "docker-registry to answer", 0.05)

    def get(self, path: str) -> tuple[int, bytes]:
        """HTTP GET from the root namespace (no proxy); (0, b"") when nothing answers."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://{self.address}{path}", timeout=2) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
        except OSError:
            return 0, b""

    def stored_bytes(self) -> int:
        """Bytes of the blobs the registry holds (the pushed images, compressed)."""
        blobs = self.root / "storage" / "docker" / "registry" / "v2" / "blobs"
        return sum(p.stat().st_size for p in blobs.rglob("data") if p.is_file())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ImageRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


BUILD_STEP = """\
FROM {base}
# the layer vmrun's pull progress counts beside the base one; NGC images work in /workspace
RUN python3 -c "import torch; print(torch.__version__)" > /etc/vmrun-test-image \\
    && mkdir -m 1777 /workspace
ENV PYTHONUNBUFFERED=1
WORKDIR /workspace
"""


def push_test_image(
    builder: DockerDaemon, registry: ImageRegistry, rootfs_tar: Path
) -> tuple[str, dict[str, float]]:
    """``docker import`` the cached rootfs, a small build step, ``docker push``: returns the
    image reference and how long each step took (seconds)."""
    ref = f"{registry.address}/{IMAGE_REPO}:{IMAGE_TAG}"
    base = f"vmrun-test/base:{IMAGE_TAG}"
    times: dict[str, float] = {}
    t = time.monotonic()
    builder.docker("import", "--change", f"ENV PATH={STD_PATH}", str(rootfs_tar), base, timeout=600)
    times["import"] = time.monotonic() - t
    context = builder.root / "build"
    context.mkdir()
    write_text(context / "Dockerfile", BUILD_STEP.format(base=base))
    t = time.monotonic()
    builder.docker("build", "--network=host", "-q", "-t", ref, str(context), timeout=600)
    times["build"] = time.monotonic() - t
    t = time.monotonic()
    builder.docker("push", ref, timeout=600)
    times["push"] = time.monotonic() - t
    return ref, times


def _snapshot_stamp(rootfs_tar: Path) -> str:
    """What a registry holding the pushed test image was made from: the rootfs's stamp and
    the build step."""
    stamp = rootfs_tar.with_name("stamp")
    rootfs = stamp.read_text().strip() if stamp.is_file() else str(rootfs_tar.stat().st_mtime_ns)
    return hashlib.sha256(f"{rootfs}\n{BUILD_STEP}".encode()).hexdigest()[:16]


def registry_snapshot(rootfs_tar: Path) -> Path | None:
    """The storage of a registry the test image was pushed to, kept beside the rootfs by the
    first DockerBed of a machine (and current), else None: later beds start their registry
    from a copy of it instead of a builder daemon, an import, a build and a push (about a
    minute on 2 cores)."""
    snap = rootfs_tar.with_name("registry")
    done = snap / ".stamp"
    if done.is_file() and done.read_text().strip() == _snapshot_stamp(rootfs_tar):
        return snap
    return None


def _keep_snapshot(registry: ImageRegistry, rootfs_tar: Path) -> None:
    """Copy the registry's storage beside the rootfs (whole or not at all: a temporary name,
    renamed into place once complete)."""
    snap = rootfs_tar.with_name("registry")
    part = rootfs_tar.with_name(f"registry.part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    try:
        subprocess.run(["cp", "-a", str(registry.root / "storage"), str(part)], check=True)
        write_text(part / ".stamp", _snapshot_stamp(rootfs_tar) + "\n")
        shutil.rmtree(snap, ignore_errors=True)
        os.rename(part, snap)
    finally:
        shutil.rmtree(part, ignore_errors=True)


class DockerBed:
    """On ``bed``: a registry host (``registry_name``) serving the test image, pushed once
    from ``rootfs_tar`` by a builder daemon there (stopped after the push, freeing its
    disk; the registry's storage is then kept beside the rootfs, and the next bed's
    registry starts from a copy of it), and one dockerd per host in ``names`` that pulls
    from it over http; or, given ``hosts``, one on each of those hosts the bed has already
    (a Slurm cluster's compute hosts), their sockets' group ``group`` (see DockerDaemon).

    ``hosts``, ``daemons`` (host name -> DockerDaemon), ``image`` (the reference),
    ``registry``, ``timings`` (seconds: import, build, push, daemon start), ``image_bytes``
    (the image's compressed size in the registry: what a pull transfers)."""

    def __init__(
        self,
        bed: NetnsBed,
        rootfs_tar: Path,
        *,
        names: Sequence[str] = ("d1", "d2"),
        registry_name: str = "reg",
        hosts: Sequence[TestHost] | None = None,
        group: str = DOCKER_GROUP,
    ) -> None:
        self.bed = bed
        self.daemons: dict[str, DockerDaemon] = {}
        self.registry: ImageRegistry | None = None
        self.timings: dict[str, float] = {}
        self._closed = False
        try:
            reg_host = bed.add_host(registry_name)
            self.hosts = list(hosts) if hosts is not None else [bed.add_host(n) for n in names]
            seed = registry_snapshot(rootfs_tar)
            started = time.monotonic()
            self.registry = ImageRegistry(reg_host, seed=seed)
            if seed is not None:
                self.image = f"{self.registry.address}/{IMAGE_REPO}:{IMAGE_TAG}"
                self.timings["registry from its snapshot"] = time.monotonic() - started
            else:
                with DockerDaemon(reg_host, insecure_registries=[self.registry.address]) as builder:
                    self.timings["daemon start"] = builder.started_in
                    self.image, steps = push_test_image(builder, self.registry, rootfs_tar)
                    self.timings.update(steps)
                _keep_snapshot(self.registry, rootfs_tar)
            self.image_bytes = self.registry.stored_bytes()  # compressed, as pulled
            for host in self.hosts:
                self.daemons[host.name] = DockerDaemon(
                    host, insecure_registries=[self.registry.address], group=group
                )
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise

    def pids(self) -> list[int]:
        """Every daemon's and the registry's pid (for checks that they are gone)."""
        pids = [d.pid for d in self.daemons.values()]
        pids.append(self.registry.pid if self.registry else None)
        return [p for p in pids if p is not None]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors = []
        for daemon in self.daemons.values():
            try:
                daemon.close()
            except Exception as exc:
                errors.append(exc)
        if self.registry is not None:
            self.registry.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> DockerBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
