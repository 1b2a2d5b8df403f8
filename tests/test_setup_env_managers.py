"""Changing a step's parameters on a host set up before re-runs that step, and it succeeds, for
every env manager (venv, uv, conda, python) on real sshd test hosts.

A changed fingerprint runs a step's apply without its check, so every branch of python-env's
apply must do its job again: before, the `python` manager's apply was only `exit 1`, and
`--python OTHER` (or `--force python-env`) on a host set up before failed saying the
interpreter did not exist when it did. Only python-env runs here (`--only`): torch and verify
are covered by tests/test_cli_setup.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, error_in, standin_miniconda
from test_cli_setup import _wipe, uv_wheelhouse  # noqa: F401 (a fixture, used by name)
from testbed import NetnsBed, TestHost

ONLY = ("--only", "python-env")


@pytest.fixture
def h1(bed: NetnsBed) -> Iterator[TestHost]:
    host = bed["h1"]
    _wipe(host)
    (host.home / "conda-calls").unlink(missing_ok=True)
    yield host
    _wipe(host)
    (host.home / "conda-calls").unlink(missing_ok=True)


def _setup_ok(client: Client, *args: str) -> subprocess.CompletedProcess[str]:
    done = client.vmrun("setup", "h1", *ONLY, "--no-record", *args, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "ran 1 (python-env)" in done.stdout, done.stdout
    return done


def _recorded_python(host: TestHost) -> str:
    return json.loads((host.home / ".vmrun" / "host.json").read_text())["python"]


def test_python_manager_takes_another_interpreter_and_a_forced_rerun(
    bed_client: Client, h1: TestHost, host_python: Path
) -> None:
    """venv first, then --python: python-env's inputs changed, so it runs; its apply checks the
    interpreter runs (before: exit 1, "needs --python PATH to an interpreter that exists")."""
    _setup_ok(bed_client, "--env-manager", "venv")
    assert _recorded_python(h1) == f"{h1.home}/.vmrun/envs/vmrun/bin/python"
    done = _setup_ok(bed_client, "--python", str(host_python))
    assert f"python={host_python}" in done.stdout
    assert _recorded_python(h1) == str(host_python)
    _setup_ok(bed_client, "--python", "/usr/bin/python3")  # one interpreter to another
    assert _recorded_python(h1) == "/usr/bin/python3"
    _setup_ok(bed_client, "--python", "/usr/bin/python3", "--force", "python-env")
    missing = bed_client.vmrun("setup", "h1", *ONLY, "--no-record", "--python", "/nope/python3")
    assert missing.returncode == 1
    code, said = error_in(missing.stderr)
    assert code == "setup-step-failed" and "/nope/python3" in said, missing.stderr


def test_venv_manager_reruns_for_a_new_name_and_when_forced(
    bed_client: Client, h1: TestHost
) -> None:
    _setup_ok(bed_client, "--env-manager", "venv")
    _setup_ok(bed_client, "--env-manager", "venv", "--env-name", "other")
    assert _recorded_python(h1) == f"{h1.home}/.vmrun/envs/other/bin/python"
    assert (h1.home / ".vmrun" / "envs" / "other" / "bin" / "python").exists()
    _setup_ok(bed_client, "--env-manager", "venv", "--env-name", "other", "--force", "python-env")


def test_uv_manager_reruns_for_a_new_name_and_when_forced(
    bed_client: Client,
    h1: TestHost,
    uv_wheelhouse: Path,  # noqa: F811
) -> None:
    version = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    args = ["--env-manager", "uv", "--wheelhouse", str(uv_wheelhouse), "--python-version", version]
    _setup_ok(bed_client, *args)
    _setup_ok(bed_client, *args, "--env-name", "other")
    assert _recorded_python(h1) == f"{h1.home}/.vmrun/envs/other/bin/python"
    _setup_ok(bed_client, *args, "--env-name", "other", "--force", "python-env")


def test_conda_manager_makes_the_env_again_for_a_new_python_version(
    bed_client: Client, h1: TestHost, host_python: Path, tmp_path: Path
) -> None:
    """A STAND-IN Miniconda installer (no download here): its conda logs every call."""
    installer = tmp_path / "Miniconda3-standin.sh"
    installer.write_text(standin_miniconda(str(host_python), '"$HOME/conda-calls"'))
    args = ["--env-manager", "conda", "--installer", str(installer)]
    _setup_ok(bed_client, *args)
    _setup_ok(bed_client, *args, "--python-version", "3.11")
    done = _setup_ok(bed_client, *args, "--python-version", "3.11", "--force", "python-env")
    assert f"python={h1.home}/miniconda3/envs/vmrun/bin/python" in done.stdout
    calls = (h1.home / "conda-calls").read_text().splitlines()
    creates = [c for c in calls if c.startswith("conda create")]
    assert [c.split("python=")[1].split()[0] for c in creates] == ["3.12", "3.11", "3.11"]
    # the existing env is removed before it is made again, not created over
    assert calls.count("conda env remove -y -n vmrun") == 2, calls


def test_the_deprecated_env_flag_still_picks_the_manager(bed_client: Client, h1: TestHost) -> None:
    plan = bed_client.vmrun("setup", "h1", *ONLY, "--env", "uv", "--dry-run", timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "vmrun: warning: setup --env is deprecated: use --env-manager" in plan.stderr
    assert "# VMRUN_ENV=uv" in plan.stdout, plan.stdout


def test_a_dry_run_shows_only_the_branch_of_the_chosen_manager(
    bed_client: Client, h1: TestHost
) -> None:
    """python-env's apply branches on env: --dry-run prints the uv branch, none of the others
    (before: the whole `case` over venv, uv, conda and python)."""
    plan = bed_client.vmrun("setup", "h1", *ONLY, "--env-manager", "uv", "--dry-run", timeout=120)
    assert plan.returncode == 0, plan.stderr
    out = plan.stdout
    assert "would run python-env" in out and "# VMRUN_ENV=uv" in out, out
    assert 'UV_VENV_CLEAR=1 "$uv" venv --python "$VMRUN_PYTHON_VERSION"' in out  # uv's
    assert 'python3 -m venv "$(dirname' not in out  # venv's
    assert "miniconda3" not in out and "conda create" not in out  # conda's
    assert "does not run on this host" not in out  # python's
    assert "case " not in out and "esac" not in out
