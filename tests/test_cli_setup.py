"""`vmrun setup` end to end on real sshd test hosts (no sudo, no package index).

The hosts are air-gapped, so the full run uses --wheelhouse with the local CPU build of
torch; the GPU and driver branches use stand-ins for nvidia-smi/lspci/sudo (there is no GPU
here), each named a stand-in in its own text.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TORCH_SPEC, Client, install_standin, wait_for
from testbed import NetnsBed, TestHost

from vmrun.config import load_settings
from vmrun.inventory import project_hosts

T4_SMI = r"""
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


def _wipe(host: TestHost) -> None:
    for name in (".vmrun", "miniconda3", "reboot-requested", "rebooted", "after-reboot"):
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
    return {str(p.relative_to(home)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in home.rglob("*")}


def test_full_setup_in_parallel_then_a_second_run_skips_everything(
        bed_client: Client, hosts: list[TestHost], wheelhouse: Path) -> None:
    h1, h2 = hosts[0], hosts[1]
    args = ["setup", "h1", "h2", "--env", "venv", "--torch", TORCH_SPEC,
            "--wheelhouse", str(wheelhouse)]
    first = bed_client.vmrun(*args, timeout=600)
    assert first.returncode == 0, first.stderr + first.stdout
    for host in (h1, h2):
        record = json.loads((host.home / ".vmrun" / "host.json").read_text())
        python = f"{host.home}/.vmrun/envs/vmrun/bin/python"
        assert record["python"] == python
        assert record["torch"].startswith("2.13.0")
        assert record["cuda_available"] == "False"
        # the verify step really imported torch in that env, on that host
        assert f"torch={record['torch']}" in (bed_client.cwd / ".vmrun" / "logs" /
                                              "setup-h1.log").read_text()
    assert "ran 4 (python-env, torch, verify" not in first.stdout  # venv package is adopted
    assert "no NVIDIA GPU (CPU environment)" in first.stdout
    recorded = project_hosts(load_settings(cwd=bed_client.cwd, environ=bed_client.environ()))
    assert [(e.label, e.vars["python"]) for e in recorded] == [
        ("h1", f"{h1.home}/.vmrun/envs/vmrun/bin/python"),
        ("h2", f"{h2.home}/.vmrun/envs/vmrun/bin/python")]

    second = bed_client.vmrun(*args, timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("ran 0 (nothing)") == 2, second.stdout

    # one changed input re-runs that step and the ones that need it, nothing else
    third = bed_client.vmrun("setup", "h1", "--env", "venv", "--torch", "torch>=2.0",
                             "--wheelhouse", str(wheelhouse), timeout=300)
    assert third.returncode == 0, third.stderr
    assert "ran 2 (torch, verify)" in third.stdout, third.stdout


def test_dry_run_changes_nothing_and_shows_the_scripts(bed_client: Client,
                                                       hosts: list[TestHost]) -> None:
    h3 = hosts[2]
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


def test_existing_interpreter_with_python_flag(bed_client: Client, hosts: list[TestHost],
                                               host_python: Path) -> None:
    done = bed_client.vmrun("setup", "h3", "--python", str(host_python), "--torch", TORCH_SPEC)
    assert done.returncode == 0, done.stderr
    assert "ran 1 (verify)" in done.stdout, done.stdout
    assert f"python={host_python}" in done.stdout and "torch=2.13.0" in done.stdout


def test_one_failing_host_does_not_stop_the_others(bed_client: Client, hosts: list[TestHost],
                                                   tmp_path: Path) -> None:
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
    assert "h2: step disk failed (apply exited 3): boom: No space left on device" in done.stderr
    assert "1 of 3 hosts failed" in done.stderr
    for host in (hosts[0], hosts[2]):
        assert (host.home / "disk-ok").exists()
        (host.home / "disk-ok").unlink()
    for host in hosts:
        (host.home / "prepared").unlink(missing_ok=True)
    recorded = project_hosts(load_settings(cwd=bed_client.cwd, environ=bed_client.environ()))
    assert [e.label for e in recorded] == ["h1", "h3"]


def _simulate_reboot(host: TestHost, errors: list[BaseException]) -> threading.Thread:
    """The host's "reboot": when asked, drop sshd and every session, come back 2 s later."""

    def reboot() -> None:
        try:
            wait_for(lambda: (host.home / "reboot-requested").exists(), 120,
                     "the reboot command")
            host.stop_sshd()
            (host.home / "rebooted").touch()
            threading.Event().wait(2)  # the host is down for a while
            host.start_sshd()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reboot, daemon=True)
    thread.start()
    return thread


def test_reboot_drops_the_connection_and_setup_continues(bed_client: Client,
                                                         hosts: list[TestHost],
                                                         tmp_path: Path) -> None:
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


def test_gpu_host_with_a_working_driver_keeps_it(bed_client: Client, hosts: list[TestHost]
                                                 ) -> None:
    h2 = hosts[1]
    install_standin(h2, "lspci", T4_LSPCI)
    install_standin(h2, "nvidia-smi", T4_SMI)
    done = bed_client.vmrun("setup", "h2", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "1 NVIDIA GPU(s)" in done.stdout
    assert "skip nvidia-driver: already present" in done.stdout
    # driver 525 runs CUDA 12.0: the newest wheel index at or below it is cu118
    assert "--index-url https://download.pytorch.org/whl/cu118" in done.stdout


def test_driver_library_mismatch_reboots_instead_of_reinstalling(
        bed_client: Client, hosts: list[TestHost], host_python: Path) -> None:
    h3 = hosts[2]
    install_standin(h3, "lspci", T4_LSPCI)
    install_standin(h3, "sudo", 'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    install_standin(h3, "nvidia-smi", """
if [ ! -e "$HOME/rebooted" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"
  echo "NVML library version: 535.183"
  exit 18
fi
echo "GPU 0: Tesla T4 (UUID: GPU-1b2c)"
""")
    errors: list[BaseException] = []
    rebooter = _simulate_reboot(h3, errors)
    done = bed_client.vmrun("setup", "h3", "--python", str(host_python), "--torch", TORCH_SPEC,
                            "--only", "nvidia-driver", "--reboot-timeout", "60",
                            "--param", 'reboot_command=touch "$HOME/reboot-requested"')
    rebooter.join(30)
    assert not errors, errors
    assert done.returncode == 0, done.stderr + done.stdout
    assert "rebooted" in done.stdout and "ran 1 (nvidia-driver)" in done.stdout
    log = (bed_client.cwd / ".vmrun" / "logs" / "setup-h3.log").read_text()
    assert "Driver/library version mismatch" in log
    assert "nvidia-driver: apply" not in log  # nothing was reinstalled


def test_sudo_needing_a_password_fails_before_changing_anything(
        bed_client: Client, hosts: list[TestHost]) -> None:
    h1 = hosts[0]
    install_standin(h1, "lspci", T4_LSPCI)  # a GPU, no driver, and no sudo on the host
    before = {p for p in _snapshot(h1.home) if not p.startswith(".vmrun")}
    done = bed_client.vmrun("setup", "h1")
    assert done.returncode == 14
    assert "need root, and there is no sudo; nothing was changed" in done.stderr
    assert {p for p in _snapshot(h1.home) if not p.startswith(".vmrun")} == before
    assert not (h1.home / ".vmrun" / "setup").exists()


def test_conda_with_an_uploaded_installer(bed_client: Client, hosts: list[TestHost],
                                          host_python: Path, tmp_path: Path) -> None:
    """--installer uploads a Miniconda installer; a stand-in one, as no download is possible.

    The stand-in installs a `conda` whose `create` makes the env's python run an interpreter
    that already has torch, so the torch and verify steps run for real.
    """
    installer = tmp_path / "Miniconda3-standin.sh"
    installer.write_text(f"""#!/bin/bash
# STAND-IN for the Miniconda installer (no internet here): honours -b -u -p PREFIX
while [ $# -gt 0 ]; do case "$1" in -p) prefix=$2; shift ;; esac; shift; done
mkdir -p "$prefix/bin"
cat > "$prefix/bin/conda" <<'EOF'
#!/bin/bash
# STAND-IN conda: records its arguments; `create -n NAME` makes envs/NAME/bin/python
echo "$@" >> "$(dirname "$0")/../conda-calls"
if [ "$1" = create ]; then
  while [ $# -gt 0 ]; do case "$1" in -n) name=$2; shift ;; esac; shift; done
  mkdir -p "$(dirname "$0")/../envs/$name/bin"
  printf '#!/bin/sh\nexec {host_python} "$@"\n' > "$(dirname "$0")/../envs/$name/bin/python"
  chmod +x "$(dirname "$0")/../envs/$name/bin/python"
fi
EOF
chmod +x "$prefix/bin/conda"
""")
    h2 = hosts[1]
    done = bed_client.vmrun("setup", "h2", "--env", "conda", "--env-name", "pytorch",
                            "--installer", str(installer), "--torch", TORCH_SPEC)
    assert done.returncode == 0, done.stderr + done.stdout
    calls = (h2.home / "miniconda3" / "conda-calls").read_text()
    assert "create -y -n pytorch --override-channels -c conda-forge python=3.12 pip" in calls
    assert (h2.home / ".vmrun" / "installers" / installer.name).exists()
    assert f"python={h2.home}/miniconda3/envs/pytorch/bin/python" in done.stdout
    assert "torch=2.13.0" in done.stdout
