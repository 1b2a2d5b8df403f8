"""`vmrun setup` end to end on real sshd test hosts (no sudo, no package index).

The hosts are air-gapped, so the full run uses --wheelhouse with the local CPU build of
torch; the GPU and driver branches use stand-ins for nvidia-smi/lspci/sudo (there is no GPU
here), each named a stand-in in its own text. The driver install also needs stand-ins for
ubuntu-drivers, apt-get and dpkg-query, and a failing reboot for systemctl and reboot: the
test hosts have no root and no package archive. sysfs detection gets STAND-IN PCI device
entries bind-mounted over /sys/bus/pci/devices inside a test host's mount namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    CACHE,
    TORCH_SPEC,
    Client,
    _build_once,
    error_in,
    errors_in,
    install_standin,
    place_hostlib,
    standin_miniconda,
    wait_for,
)
from testbed import NetnsBed, TestHost

from vmrun.config import load_settings
from vmrun.ssh.inventory import project_hosts

T4_SMI = r"""
case "$*" in *compute_cap*) echo 7.5; exit 0 ;; esac
cat <<'EOF'
Sat Nov 21 17:00:00 2026
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 525.147.05   Driver Version: 525.147.05   CUDA Version: 12.0     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
|   0  Tesla T4            Off  | 00000000:00:1E.0 Off |                    0 |
+-------------------------------+----------------------+----------------------+
EOF
"""
T4_LSPCI = 'echo "00:1e.0 3D controller: NVIDIA Corporation TU104GL [Tesla T4] (rev a1)"\n'

# sudo that runs nothing as root: the test hosts have none, so this one runs the other
# stand-ins (and `true`, vmrun's probe) as the same unprivileged user and refuses the rest
STRICT_SUDO = r"""# passwordless, but it runs only stand-ins, as this same user
while [ "${1#-}" != "$1" ]; do shift; done
[ "$1" = true ] && exit 0
case "$(command -v "$1")" in "$HOME/.vmrun/bin/"*) exec "$@" ;; esac
echo "STAND-IN sudo: refusing $1, which is not a stand-in" >&2
exit 1
"""

# behaves like real `sudo -n` for a user whose sudo asks for a password
PASSWORD_SUDO = 'echo "sudo: a password is required" >&2\nexit 1\n'

# apt-get, dpkg-query and ubuntu-drivers act on a stand-in package list, ~/standin-dpkg
# ("STATUS NAME" lines); every call is logged to ~/standin-calls
APT_GET = r"""# logs each call; `install` marks its packages installed in ~/standin-dpkg
echo "apt-get $*" >> "$HOME/standin-calls"
cmd=
while [ $# -gt 0 ]; do
  case "$1" in
    -o) shift ;;
    -*) ;;
    *) if [ -z "$cmd" ]; then cmd=$1
       elif [ "$cmd" = install ]; then echo "ii $1" >> "$HOME/standin-dpkg"; fi ;;
  esac
  shift
done
"""

DPKG_QUERY = r"""# answers `dpkg-query -W -f=FORMAT PATTERN...` from ~/standin-dpkg; like
# dpkg-query it says so and exits 1 when a pattern matches no package
set -f
fmt='${Package}\n'; pats=
while [ $# -gt 0 ]; do
  case "$1" in
    -W|--show) ;;
    -f) fmt=$2; shift ;;
    -f=*|--showformat=*) fmt=${1#*=} ;;
    *) pats="$pats $1" ;;
  esac
  shift
done
touch "$HOME/standin-dpkg"
rc=0
for pat in $pats; do
  hit=0
  while read -r status name; do
    case "$name" in $pat)
      hit=1
      printf "$(printf '%s' "$fmt" | sed -e "s/\${db:Status-Abbrev}/$status /g" \
        -e "s/\${Package}/$name/g")" ;;
    esac
  done < "$HOME/standin-dpkg"
  [ "$hit" = 1 ] || { echo "dpkg-query: no packages found matching $pat" >&2; rc=1; }
done
exit $rc
"""

UBUNTU_DRIVERS = r"""# acts out `ubuntu-drivers install --gpgpu` for a Tesla T4 on Ubuntu 24.04:
# the 535-server branch as headless/server packages, and no nvidia-driver-535 package
echo "ubuntu-drivers $*" >> "$HOME/standin-calls"
[ "$*" = "install --gpgpu" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
for p in nvidia-headless-no-dkms-535-server libnvidia-compute-535-server \
         linux-modules-nvidia-535-server-generic nvidia-kernel-common-535-server \
         nvidia-compute-utils-535-server; do
  echo "ii $p" >> "$HOME/standin-dpkg"
done
"""


# no nvidia-smi until its utils package is installed; the driver answers only after the
# (simulated) reboot, as a freshly installed kernel module does
FRESH_SMI = r"""
grep -qx 'ii @UTILS@' "$HOME/standin-dpkg" 2>/dev/null \
  || { echo "nvidia-smi: command not found" >&2; exit 127; }
if [ ! -e "$HOME/rebooted" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
  exit 9
fi
case "$*" in
  *compute_cap*) echo 7.5 ;;
  -L) echo "GPU 0: Tesla T4 (UUID: GPU-1b2c)" ;;
  *) echo "| NVIDIA-SMI @VERSION@   Driver Version: @VERSION@   CUDA Version: @CUDA@  |" ;;
esac
"""


def _fresh_smi(utils: str, version: str, cuda: str) -> str:
    """A STAND-IN nvidia-smi for a freshly installed driver: none until the `utils` package is
    installed, and the driver answers only after the (simulated) reboot, as a freshly
    installed kernel module does."""
    return FRESH_SMI.replace("@UTILS@", utils).replace("@VERSION@", version).replace("@CUDA@", cuda)


FRESH_535_SMI = _fresh_smi("nvidia-utils-535-server", "535.183.01", "12.2")

# a driver installed but not loaded yet: the kernel still runs the old module
MISMATCH_SMI = """
if [ ! -e "$HOME/rebooted" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"
  echo "NVML library version: 535.183"
  exit 18
fi
echo "GPU 0: Tesla T4 (UUID: GPU-1b2c)"
"""

V100_SMI = r"""
case "$*" in
  *compute_cap*) echo 7.0 ;;
  *) echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0  |" ;;
esac
"""
V100_LSPCI = 'echo "00:1e.0 3D controller: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB]"\n'


def _package_world(host: TestHost) -> None:
    """Stand-ins for root and the package system; a removed old driver left in dpkg's list."""
    install_standin(host, "sudo", STRICT_SUDO)
    install_standin(host, "apt-get", APT_GET)
    install_standin(host, "dpkg-query", DPKG_QUERY)
    install_standin(host, "ubuntu-drivers", UBUNTU_DRIVERS)
    host.run(["sh", "-c", 'echo "rc nvidia-driver-470" > "$HOME/standin-dpkg"'], as_user=True)


def _calls(host: TestHost) -> list[str]:
    path = host.home / "standin-calls"
    return path.read_text().splitlines() if path.exists() else []


def _last_run(log: Path) -> str:
    """The part of a per-host log written by the latest setup run."""
    return log.read_text().rsplit("===== vmrun setup", 1)[-1] if log.exists() else ""


def _wipe(host: TestHost) -> None:
    for name in (
        ".vmrun",
        "miniconda3",
        "reboot-requested",
        "rebooted",
        "after-reboot",
        ".cache",
        "standin-dpkg",
        "standin-calls",
        "dpkg-lock",
    ):
        target = host.home / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


@pytest.fixture
def hosts(bed: NetnsBed) -> Iterator[list[TestHost]]:
    """h1-h3 with no vmrun state before and after (setup writes ~/.vmrun)."""
    chosen = [bed[n] for n in ("h1", "h2", "h3")]
    for host in chosen:
        _wipe(host)
    yield chosen
    for host in chosen:
        _wipe(host)


def _snapshot(home: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(home)): (p.stat().st_size, p.stat().st_mtime_ns) for p in home.rglob("*")
    }


@pytest.mark.timeout(600)
def test_setup_installs_numpy_with_torch_and_a_wheelhouse_without_it_leaves_it_out(
    bed_client: Client,
    hosts: list[TestHost],
    wheelhouse: Path,
    wheelhouse_tensorboard: Path,
    tmp_path: Path,
) -> None:
    """torch's wheel no longer brings numpy, which torch.distributed.checkpoint needs over
    several ranks (train --fsdp): the torch step installs it from the wheelhouse that has it,
    and says so where the wheelhouse lacks it (the full setup above: every other step as
    before)."""
    h1 = hosts[0]
    both = tmp_path / "wheels"
    both.mkdir()
    for wheel in [*wheelhouse.glob("*.whl"), *wheelhouse_tensorboard.glob("numpy-*.whl")]:
        try:
            os.link(wheel, both / wheel.name)
        except OSError:
            shutil.copy(wheel, both / wheel.name)
    args = ["setup", "h1", "--env-manager", "venv", "--torch", TORCH_SPEC, "--wheelhouse"]
    done = bed_client.vmrun(*args, str(both), timeout=500)
    assert done.returncode == 0, done.stderr + done.stdout
    python = f"{h1.home}/.vmrun/envs/vmrun/bin/python"
    probe = h1.run(
        [python, "-c", "import numpy; print(numpy.__version__)"], as_user=True, text=True
    )
    assert probe.returncode == 0 and probe.stdout.strip(), probe.stderr
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h1.log")
    assert "numpy is not in the wheelhouse" not in log

    _wipe(h1)
    done = bed_client.vmrun(*args, str(wheelhouse), timeout=500)  # torch's wheels alone
    assert done.returncode == 0, done.stderr + done.stdout
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h1.log")
    assert "numpy is not in the wheelhouse: left out" in log, log


@pytest.mark.timeout(900)  # its own deadlines: setup 600 s, then 120 + 300 s, and more
def test_full_setup_in_parallel_then_a_second_run_skips_everything(
    bed_client: Client, hosts: list[TestHost], wheelhouse: Path
) -> None:
    h1, h2 = hosts[0], hosts[1]
    args = [
        "setup",
        "h1",
        "h2",
        "--env-manager",
        "venv",
        "--torch",
        TORCH_SPEC,
        "--wheelhouse",
        str(wheelhouse),
    ]
    first = bed_client.vmrun(*args, timeout=600)
    assert first.returncode == 0, first.stderr + first.stdout
    for host in (h1, h2):
        record = json.loads((host.home / ".vmrun" / "host.json").read_text())
        python = f"{host.home}/.vmrun/envs/vmrun/bin/python"
        assert record["python"] == python
        assert record["torch"].startswith("2.13.0")
        assert record["cuda_available"] == "False"
        # the verify step really imported torch in that env, on that host: its own log says so
        log = _last_run(bed_client.cwd / ".vmrun" / "logs" / f"setup-{host.name}.log")
        assert f" on {host.name}\n" in log
        assert f"torch={record['torch']}" in log
        # python3-venv is installed here, so its step is adopted, not run
        summary = (
            rf"^{host.name}: ok in [0-9.]+ s: ran 3 \(python-env, torch, verify\),"
            r" 1 already done; no NVIDIA GPU \(CPU environment\)$"
        )
        assert re.search(summary, first.stdout, re.M), first.stdout
    recorded = project_hosts(load_settings(cwd=bed_client.cwd, environ=bed_client.environ()))
    assert [(e.label, e.vars["python"]) for e in recorded] == [
        ("h1", f"{h1.home}/.vmrun/envs/vmrun/bin/python"),
        ("h2", f"{h2.home}/.vmrun/envs/vmrun/bin/python"),
    ]

    second = bed_client.vmrun(*args, timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("ran 0 (nothing)") == 2, second.stdout

    # one changed input re-runs that step and the ones that need it, nothing else
    third = bed_client.vmrun(
        "setup",
        "h1",
        "--env-manager",
        "venv",
        "--torch",
        "torch>=2.0",
        "--wheelhouse",
        str(wheelhouse),
        timeout=300,
    )
    assert third.returncode == 0, third.stderr
    assert "ran 2 (torch, verify), 2 already done" in third.stdout, third.stdout

    # --force on the default playbook: that step and every step that needs it, nothing else
    plan = bed_client.vmrun(
        "setup",
        "h1",
        "--env-manager",
        "venv",
        "--torch",
        "torch>=2.0",
        "--force",
        "python-env",
        "--dry-run",
    )
    assert plan.returncode == 0, plan.stderr
    assert "would run python-env (forced)" in plan.stdout, plan.stdout
    assert "would run torch (after python-env)" in plan.stdout
    assert "would run verify (after torch)" in plan.stdout
    assert "skip python-venv-package: check passes" in plan.stdout
    # --only: that step alone, not the ones that need it (tests/test_cli_setup_options.py
    # runs both options for real on a playbook of cheap steps)
    only = bed_client.vmrun(
        "setup", "h2", *args[3:], "--force", "torch", "--only", "torch", "--dry-run"
    )
    assert only.returncode == 0, only.stderr
    assert "would run torch (forced)" in only.stdout, only.stdout
    assert "skip verify: unselected" in only.stdout and "skip python-env: unselected" in only.stdout


def test_hosts_are_set_up_at_the_same_time(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    """Proof of parallelism: an extra step on each host leaves a marker and then waits (30 s at
    most) for every host's marker. Hosts set up one after another would never all meet."""
    meeting = Path(tempfile.mkdtemp(prefix="vmrun-meet-", dir="/tmp"))
    meeting.chmod(0o1777)  # every host user writes its marker here
    extra = tmp_path / "meet.yaml"
    extra.write_text(f"""
steps:
  - name: meet
    apply: |
      touch {meeting}/"$(hostname)"
      end=$((SECONDS + 30))
      until [ "$(ls {meeting} | wc -l)" -ge 3 ]; do
        if [ "$SECONDS" -ge "$end" ]; then
          echo "alone after 30 s; arrived: $(ls {meeting} | xargs)" >&2
          exit 1
        fi
        sleep 0.1
      done
""")
    try:
        done = bed_client.vmrun("setup", "h1", "h2", "h3", "--extra", str(extra), "--only", "meet")
        assert done.returncode == 0, done.stderr + done.stdout
        assert sorted(p.name for p in meeting.iterdir()) == ["vmt-h1", "vmt-h2", "vmt-h3"]
    finally:
        shutil.rmtree(meeting)
    for name in ("h1", "h2", "h3"):
        summary = rf"^{name}: ok in [0-9.]+ s: ran 1 \(meet\)"
        assert re.search(summary, done.stdout, re.M), done.stdout


def test_dry_run_changes_nothing_and_shows_the_scripts(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    h3 = hosts[2]
    place_hostlib(h3)  # vmrun's own scripts, placed by any first command
    before = _snapshot(h3.home)
    done = bed_client.vmrun("setup", "h3", "--dry-run", "--torch", TORCH_SPEC)
    assert done.returncode == 0, done.stderr
    assert _snapshot(h3.home) == before
    out = done.stdout
    assert "skip nvidia-driver: no NVIDIA GPU" in out
    assert "would run python-env (not done yet)" in out
    assert "python3 -m venv" in out
    assert "would run torch" in out
    # a CPU host gets the CPU wheel index, never the multi-GB CUDA build
    assert "VMRUN_PIP_INDEX_ARGS=--index-url https://download.pytorch.org/whl/cpu" in out
    assert not (bed_client.cwd / "vmrun.toml").exists()


def test_existing_interpreter_with_python_flag(
    bed_client: Client, hosts: list[TestHost], host_python: Path
) -> None:
    """h3 is listed in vmrun.toml with another interpreter: setup updates that line only."""
    toml = bed_client.cwd / "vmrun.toml"
    listed = (
        '# the lab\n[[hosts]]\naddress = "h3"\npython = "/usr/bin/python3"  # old one\n'
        'groups = ["lab"]\n'
    )
    toml.write_text(listed)
    toml.chmod(0o644)
    done = bed_client.vmrun("setup", "h3", "--python", str(host_python), "--torch", TORCH_SPEC)
    assert done.returncode == 0, done.stderr
    assert "ran 1 (verify)" in done.stdout, done.stdout
    assert f"python={host_python}" in done.stdout and "torch=2.13.0" in done.stdout
    assert "updated the python of h3" in done.stdout
    assert toml.read_text() == listed.replace("/usr/bin/python3", str(host_python))
    assert stat.S_IMODE(toml.stat().st_mode) == 0o644


def test_one_failing_host_does_not_stop_the_others(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    book = tmp_path / "book.yaml"
    book.write_text("""
name: flaky
steps:
  - name: prepare
    apply: echo prepared > "$HOME/prepared"
  - name: disk
    needs: [prepare]
    apply: |
      case "$(hostname)" in
        *h2) echo "writing model cache"; echo "boom: No space left on device" >&2; exit 3 ;;
      esac
      echo ok > "$HOME/disk-ok"
""")
    done = bed_client.vmrun("setup", "h1", "h2", "h3", "--playbook", str(book))
    assert done.returncode == 1
    (code, said), summary = errors_in(done.stderr)  # the host's line, then the count
    assert code == "setup-step-failed" and "h2: step disk" in said and "exited 3" in said, said
    assert "boom: No space left on device" in said, said  # its last line: the why
    # under it, the failing command's own last lines, from both of its streams
    assert "\n    writing model cache\n" in done.stderr, done.stderr
    assert "\n    boom: No space left on device\n" in done.stderr, done.stderr
    assert summary[0] == "hosts-failed" and summary[1].startswith("1 of 3 ")
    for host in (hosts[0], hosts[2]):
        assert (host.home / "disk-ok").exists()
        (host.home / "disk-ok").unlink()
    for host in hosts:
        (host.home / "prepared").unlink(missing_ok=True)
    recorded = project_hosts(load_settings(cwd=bed_client.cwd, environ=bed_client.environ()))
    assert [e.label for e in recorded] == ["h1", "h3"]


def _new_boot_id(host: TestHost) -> None:
    """STAND-IN for a new boot's kernel (the test hosts share this machine's): the host's
    sshd, and every session it starts, sees another boot_id, a file bind-mounted over
    /proc/sys/kernel/random/boot_id in the sshd's own mount namespace (`ip netns exec` gave
    it one; the mount goes with that namespace at the next "reboot")."""
    pid = host.sshd_pid()
    assert pid is not None, f"sshd of {host.name} is not running"
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"), (
        "the test host shares this machine's mount namespace"
    )
    folder = Path(tempfile.mkdtemp(prefix="vmrun-standin-boot-id-"))
    fake = folder / "boot_id"
    fake.write_text(f"{uuid.uuid4()}\n")
    fake.chmod(0o444)
    inside = ["nsenter", "-t", str(pid), "-m", "--"]
    try:
        subprocess.run([*inside, "mount", "--bind", str(fake), BOOT_ID], check=True)
    finally:
        shutil.rmtree(folder)  # the mount holds the file itself


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _simulate_reboot(host: TestHost, errors: list[BaseException]) -> threading.Thread:
    """The host's "reboot": when asked, drop sshd and every session, come back 2 s later
    with another boot_id (setup counts the reboot only then)."""

    def reboot() -> None:
        try:
            wait_for(lambda: (host.home / "reboot-requested").exists(), 120, "the reboot command")
            host.stop_sshd()
            (host.home / "rebooted").touch()
            threading.Event().wait(2)  # the host is down for a while
            host.start_sshd()
            _new_boot_id(host)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reboot, daemon=True)
    thread.start()
    return thread


def test_reboot_drops_the_connection_and_setup_continues(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    h1 = hosts[0]
    book = tmp_path / "book.yaml"
    book.write_text("""
name: needs-reboot
params:
  reboot_command: touch "$HOME/reboot-requested"
steps:
  - name: kernel-module
    reboot: true
    apply: echo installed
    verify: test -e "$HOME/rebooted" || exit 100
  - name: after
    needs: [kernel-module]
    apply: touch "$HOME/after-reboot"
""")
    errors: list[BaseException] = []
    rebooter = _simulate_reboot(h1, errors)
    done = bed_client.vmrun("setup", "h1", "--playbook", str(book), "--reboot-timeout", "60")
    rebooter.join(30)
    assert not errors, errors
    assert done.returncode == 0, done.stderr
    assert "rebooted" in done.stdout
    assert "[h1] waiting for the host to come back" in done.stdout
    assert (h1.home / "after-reboot").exists()


def test_a_failing_reboot_command_is_reported_at_once(
    bed_client: Client, hosts: list[TestHost], host_python: Path
) -> None:
    """sudo may not reboot (no systemd, a policy): the default reboot command's failure and
    its output are reported as soon as it ends, not after the whole --reboot-timeout."""
    h3 = hosts[2]
    install_standin(h3, "lspci", T4_LSPCI)
    install_standin(h3, "nvidia-smi", MISMATCH_SMI)
    install_standin(h3, "sudo", STRICT_SUDO)
    refused = "Interactive authentication required."
    install_standin(
        h3, "systemctl", f'echo "Failed to reboot system via logind: {refused}" >&2\nexit 1\n'
    )
    install_standin(h3, "reboot", f'echo "Call to Reboot failed: {refused}" >&2\nexit 1\n')
    done = bed_client.vmrun(
        "setup",
        "h3",
        "--python",
        str(host_python),
        "--only",
        "nvidia-driver",
        "--reboot-timeout",
        "3600",
        # setup waiting out the 3600 s --reboot-timeout ends in TimeoutExpired here; reporting
        # the failed reboot at once takes seconds (240 s: room for a loaded machine)
        timeout=240,
    )
    assert done.returncode == 1, done.stderr + done.stdout
    assert (
        "h3: the reboot command failed (exited 1) and the host is still up: Call to Reboot"
        f" failed: {refused}"
    ) in done.stderr, done.stderr
    assert f"\n    Failed to reboot system via logind: {refused}\n" in done.stderr  # 1st try
    assert not (h3.home / "rebooted").exists()


def test_gpu_host_with_a_working_driver_keeps_it(bed_client: Client, hosts: list[TestHost]) -> None:
    h2 = hosts[1]
    install_standin(h2, "lspci", T4_LSPCI)
    install_standin(h2, "nvidia-smi", T4_SMI)
    done = bed_client.vmrun("setup", "h2", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "1 NVIDIA GPU(s)" in done.stdout
    assert "skip nvidia-driver: already present" in done.stdout
    # driver 525 runs CUDA 12.0, and so every 12.x runtime: the newest 12.x build, not cu118
    assert "VMRUN_PIP_INDEX_ARGS=--index-url https://download.pytorch.org/whl/cu128" in done.stdout


@contextlib.contextmanager
def _standin_pci_devices(host: TestHost, devices: dict[str, tuple[str, str]]) -> Iterator[None]:
    """STAND-IN PCI devices (this machine has no NVIDIA GPU): a directory of device entries
    holding `vendor` and `class` files as sysfs does, bind-mounted over /sys/bus/pci/devices in
    the mount namespace of the host's sshd (`ip netns exec` gave it its own), so every session
    vmrun opens there sees them; the machine's own /sys is untouched."""
    pid = host.sshd_pid()
    assert pid is not None, f"sshd of {host.name} is not running"
    if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
        pytest.skip("the test host shares this machine's mount namespace")
    fake = Path(tempfile.mkdtemp(prefix="vmrun-standin-pci-"))
    fake.chmod(0o755)
    for address, (vendor, klass) in devices.items():
        (fake / address).mkdir()
        (fake / address / "vendor").write_text(vendor + "\n")
        (fake / address / "class").write_text(klass + "\n")
    inside = ["nsenter", "-t", str(pid), "-m", "--"]
    subprocess.run([*inside, "mount", "--bind", str(fake), "/sys/bus/pci/devices"], check=True)
    try:
        yield
    finally:
        subprocess.run([*inside, "umount", "/sys/bus/pci/devices"], check=True)
        shutil.rmtree(fake)


def test_a_gpu_is_detected_from_sysfs_without_lspci(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    """PCI vendor 0x10de with a display class (0x03xxxx) under /sys/bus/pci/devices is a GPU;
    NVIDIA's other functions (an NVSwitch bridge) and other vendors' VGA are not."""
    h3 = hosts[2]
    if any(
        v.read_text().strip() == "0x10de" for v in Path("/sys/bus/pci/devices").glob("*/vendor")
    ):
        pytest.skip("this machine has a real NVIDIA device")
    # lspci, where a host has it, sees nothing NVIDIA here: only sysfs can find the GPU
    install_standin(h3, "lspci", "exit 0\n")
    devices = {
        "0000:00:1e.0": ("0x10de", "0x030200"),  # Tesla T4: 3D controller
        "0000:00:1f.0": ("0x10de", "0x068000"),  # NVSwitch: a bridge, not a GPU
        "0000:00:02.0": ("0x8086", "0x030000"),  # Intel VGA
    }
    before = bed_client.vmrun("setup", "h3", "--dry-run")
    assert before.returncode == 0, before.stderr
    assert "no NVIDIA GPU" in before.stdout and "skip nvidia-driver: no NVIDIA GPU" in before.stdout
    with _standin_pci_devices(h3, devices):
        done = bed_client.vmrun("setup", "h3", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert ", 1 NVIDIA GPU(s); python " in done.stdout, done.stdout
    assert "would run nvidia-driver (not done yet" in done.stdout


def test_a_volta_gpu_gets_the_last_cuda_build_with_its_kernels(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    h3 = hosts[2]
    install_standin(h3, "lspci", V100_LSPCI)
    install_standin(h3, "nvidia-smi", V100_SMI)
    done = bed_client.vmrun("setup", "h3", "--dry-run")
    assert done.returncode == 0, done.stderr
    # CUDA 13 (PyPI's default build) has no Volta kernels; cu126 does and runs on a 13.0 driver
    assert "VMRUN_PIP_INDEX_ARGS=--index-url https://download.pytorch.org/whl/cu126" in done.stdout


def test_driver_library_mismatch_reboots_instead_of_reinstalling(
    bed_client: Client, hosts: list[TestHost], host_python: Path
) -> None:
    h3 = hosts[2]
    install_standin(h3, "lspci", T4_LSPCI)
    install_standin(h3, "sudo", 'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    install_standin(h3, "nvidia-smi", MISMATCH_SMI)
    errors: list[BaseException] = []
    rebooter = _simulate_reboot(h3, errors)
    done = bed_client.vmrun(
        "setup",
        "h3",
        "--python",
        str(host_python),
        "--torch",
        TORCH_SPEC,
        "--only",
        "nvidia-driver",
        "--reboot-timeout",
        "60",
        "--param",
        'reboot_command=touch "$HOME/reboot-requested"',
    )
    rebooter.join(30)
    assert not errors, errors
    assert done.returncode == 0, done.stderr + done.stdout
    assert "rebooted" in done.stdout and "ran 1 (nvidia-driver)" in done.stdout
    log = (bed_client.cwd / ".vmrun" / "logs" / "setup-h3.log").read_text()
    assert "Driver/library version mismatch" in log
    assert "nvidia-driver: apply" not in log  # nothing was reinstalled


def test_without_sudo_a_dry_run_shows_the_plan_and_a_real_run_changes_nothing(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    h1 = hosts[0]
    install_standin(h1, "lspci", T4_LSPCI)  # a GPU, no driver, and no sudo on the host
    before = {p for p in _snapshot(h1.home) if not p.startswith(".vmrun")}
    plan = bed_client.vmrun("setup", "h1", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "would run nvidia-driver (not done yet; needs passwordless sudo)" in plan.stdout
    assert (
        "note: nvidia-driver needs root and there is no sudo: a real run stops before"
        " changing anything"
    ) in plan.stdout
    assert "ubuntu-drivers install --gpgpu" in plan.stdout  # the plan itself is all there
    done = bed_client.vmrun("setup", "h1")
    assert done.returncode == 14
    code, said = error_in(done.stderr)
    assert code == "needs-root" and "nvidia-driver" in said and "no sudo" in said, said
    assert {p for p in _snapshot(h1.home) if not p.startswith(".vmrun")} == before
    assert not (h1.home / ".vmrun" / "setup").exists()


def test_sudo_needing_a_password_fails_before_changing_anything(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    h3 = hosts[2]
    install_standin(h3, "lspci", T4_LSPCI)
    install_standin(h3, "sudo", PASSWORD_SUDO)
    place_hostlib(h3)  # vmrun's own scripts, placed by any first command
    before = _snapshot(h3.home)
    done = bed_client.vmrun("setup", "h3")
    assert done.returncode == 14
    code, said = error_in(done.stderr)
    assert code == "needs-root" and "nvidia-driver" in said, done.stderr
    assert "sudo: a password is required" in said  # sudo's own words: why it cannot run
    assert _snapshot(h3.home) == before  # not even ~/.vmrun/setup was written


def test_driver_install_finds_the_server_branch_and_torch_follows_the_new_driver(
    bed_client: Client, hosts: list[TestHost], host_python: Path
) -> None:
    """A GPU and no driver: ubuntu-drivers --gpgpu installs 535-server as headless packages,
    its nvidia-utils follows, the host reboots, and torch's index comes from the new driver."""
    h1 = hosts[0]
    _package_world(h1)
    install_standin(h1, "lspci", T4_LSPCI)
    install_standin(h1, "nvidia-smi", FRESH_535_SMI)
    args = [
        "setup",
        "h1",
        "--python",
        str(host_python),
        "--torch",
        TORCH_SPEC,
        "--only",
        "nvidia-driver",
        "--only",
        "torch",
        "--reboot-timeout",
        "60",
        "--param",
        'reboot_command=touch "$HOME/reboot-requested"',
    ]
    plan = bed_client.vmrun(*args, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "would run nvidia-driver (not done yet; needs passwordless sudo)" in plan.stdout
    # before the driver there is no CUDA version to go by: the plan says when it is decided
    assert (
        "VMRUN_PIP_INDEX_ARGS=(read again from nvidia-smi after nvidia-driver) the wheel"
        " index for the new driver"
    ) in plan.stdout
    assert _calls(h1) == []

    errors: list[BaseException] = []
    rebooter = _simulate_reboot(h1, errors)
    done = bed_client.vmrun(*args, timeout=300)
    rebooter.join(30)
    assert not errors, errors
    assert done.returncode == 0, done.stderr + done.stdout
    assert "rebooted: ran 2 (nvidia-driver, torch)" in done.stdout, done.stdout
    lock = "apt-get -o DPkg::Lock::Timeout=300"
    assert _calls(h1) == [
        f"{lock} update",  # once, before the first install
        f"{lock} install -y ubuntu-drivers-common",
        "ubuntu-drivers install --gpgpu",
        f"{lock} install -y nvidia-utils-535-server",  # found from the -server headless packages
    ]
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h1.log")
    assert "driver branch 535-server: installing nvidia-utils-535-server" in log
    assert "CUDA 12.2 (compute capability 7.5)" in log
    # pip was pointed at the CUDA 12 build for the driver installed now (none was there before)
    assert "Looking in indexes: https://download.pytorch.org/whl/cu128" in log


def test_a_pinned_driver_branch_installs_exactly_its_packages_then_reboots(
    bed_client: Client, hosts: list[TestHost], host_python: Path
) -> None:
    """--driver 580-server: apt-get installs nvidia-driver-580-server and
    nvidia-utils-580-server (no ubuntu-drivers), then the host reboots and nvidia-smi is
    verified; a value that is no branch fails before apt-get runs."""
    h2 = hosts[1]
    _package_world(h2)
    install_standin(h2, "lspci", T4_LSPCI)
    install_standin(h2, "nvidia-smi", _fresh_smi("nvidia-utils-580-server", "580.95.05", "13.0"))
    args = [
        "setup",
        "h2",
        "--python",
        str(host_python),
        "--only",
        "nvidia-driver",
        "--reboot-timeout",
        "60",
        "--param",
        'reboot_command=touch "$HOME/reboot-requested"',
    ]
    bad = bed_client.vmrun(*args, "--driver", "nvidia-580")
    assert bad.returncode == 1
    code, said = error_in(bad.stderr)
    assert code == "setup-step-failed" and "nvidia-580" in said, bad.stderr
    assert _calls(h2) == []

    errors: list[BaseException] = []
    rebooter = _simulate_reboot(h2, errors)
    done = bed_client.vmrun(*args, "--driver", "580-server", timeout=300)
    rebooter.join(30)
    assert not errors, errors
    assert done.returncode == 0, done.stderr + done.stdout
    assert "rebooted: ran 1 (nvidia-driver)" in done.stdout, done.stdout
    lock = "apt-get -o DPkg::Lock::Timeout=300"
    assert _calls(h2) == [
        f"{lock} update",
        f"{lock} install -y nvidia-driver-580-server nvidia-utils-580-server",
    ]
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h2.log")
    assert "driver branch 580-server (pinned): installing nvidia-driver-580-server" in log
    # the first verify found the driver not loaded (needs a reboot); after it, nvidia-smi works
    before, _, after = log.partition("nvidia-driver: verify after reboot")
    assert "couldn't communicate with the NVIDIA driver" in before
    assert "GPU 0: Tesla T4" in after
    assert "CUDA 13.0 (compute capability 7.5)" in after  # facts read again after the reboot


def test_apt_lock_wait_names_the_holder_and_is_bounded(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    """A process holds the dpkg lock (as unattended-upgrades does at first boot): setup names
    it, gives up after apt_lock_wait, and carries on once the lock is free."""
    h2 = hosts[1]
    _package_world(h2)  # dpkg-query says python3-venv is missing, so its apt step runs
    lock = h2.home / "dpkg-lock"
    lock.touch()
    args = ["setup", "h2", "--only", "python-venv-package", "--param", f"apt_lock_files={lock}"]
    log = bed_client.cwd / ".vmrun" / "logs" / "setup-h2.log"
    holder = f"held by pid {os.getpid()} ("  # this test process holds it
    fd = os.open(lock, os.O_RDWR)
    run = None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            short = bed_client.vmrun(*args, "--param", "apt_lock_wait=2")
            assert short.returncode == 1, short.stderr
            assert error_in(short.stderr)[0] == "setup-step-failed", short.stderr
            assert f"pid {os.getpid()} (" in short.stderr  # the step's output names the holder
            assert _calls(h2) == []  # apt-get never ran
            run = bed_client.popen(*args)
            wait_for(lambda: holder in _last_run(log), 60, "setup to name the lock holder")
            assert _calls(h2) == []
        finally:
            os.close(fd)  # the lock is free from here on
        out, err = run.communicate(timeout=120)
    finally:
        if run is not None and run.poll() is None:  # failed or timed out: don't leave it
            run.kill()
            run.wait()
    assert run.returncode == 0, err + out
    assert "ran 1 (python-venv-package)" in out
    assert _calls(h2) == [
        "apt-get -o DPkg::Lock::Timeout=300 update",
        "apt-get -o DPkg::Lock::Timeout=300 install -y python3-venv",
    ]


@pytest.fixture(scope="session")
def uv_wheelhouse() -> Path:
    """uv and pip wheels (pip download, once), for hosts without an index."""

    def build(target: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-input",
                "--no-deps",
                "uv",
                "pip",
                "-d",
                str(target),
            ],
            check=True,
            timeout=600,
        )

    try:
        return _build_once(CACHE / "wheelhouse-uv-pip", build)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"could not download the uv and pip wheels: {exc}")


def test_uv_env_installs_uv_privately_from_the_wheelhouse(
    bed_client: Client, hosts: list[TestHost], uv_wheelhouse: Path
) -> None:
    """No uv on the host, and its python3 is externally managed (PEP 668, like Ubuntu 24.04's),
    so `pip install --user uv` is refused: uv goes into a private venv under ~/.vmrun."""
    h2 = hosts[1]
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    version = subprocess.run(
        ["/usr/bin/python3", "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    done = bed_client.vmrun(
        "setup",
        "h2",
        "--env-manager",
        "uv",
        "--only",
        "python-env",
        "--wheelhouse",
        str(uv_wheelhouse),
        "--python-version",
        version,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    tools = h2.home / ".vmrun" / "tools" / "uv"
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h2.log")
    assert f"installing uv with pip into a private venv, {tools} (from the wheelhouse)" in log
    assert (tools / "bin" / "uv").is_file()
    python = h2.home / ".vmrun" / "envs" / "vmrun" / "bin" / "python"
    assert f"python={python}" in done.stdout
    pip = h2.run([str(python), "-m", "pip", "--version"], as_user=True, text=True)
    assert f"{h2.home}/.vmrun/envs/vmrun/" in pip.stdout  # the env has its own pip


def test_conda_with_an_uploaded_installer(
    bed_client: Client, hosts: list[TestHost], host_python: Path, tmp_path: Path
) -> None:
    """--installer uploads a Miniconda installer; a stand-in one, as no download is possible.

    The stand-in installs a `conda` whose `create` makes the env's python run an interpreter
    that already has torch, so the torch and verify steps run for real.
    """
    installer = tmp_path / "Miniconda3-standin.sh"
    installer.write_text(standin_miniconda(str(host_python), '"$HOME/conda-calls"'))
    h2 = hosts[1]
    done = bed_client.vmrun(
        "setup",
        "h2",
        "--env-manager",
        "conda",
        "--env-name",
        "pytorch",
        "--installer",
        str(installer),
        "--torch",
        TORCH_SPEC,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    calls = (h2.home / "conda-calls").read_text()
    assert "create -y -n pytorch --override-channels -c conda-forge python=3.12 pip" in calls
    assert (h2.home / ".vmrun" / "installers" / installer.name).exists()
    assert f"python={h2.home}/miniconda3/envs/pytorch/bin/python" in done.stdout
    assert "torch=2.13.0" in done.stdout
