"""`vmrun setup`'s options end to end on real sshd test hosts: --force/--only, extra steps
(--extra FILE, [[setup.steps]]), parameter layers, pip index pass-through, the nouveau
guidance and conda's channels.

The hosts have no sudo and no package index. pip packages come from probe wheels made here
(names that exist nowhere else, so pip can only have found them where the test put them: this
machine's /etc/pip.conf, which the hosts read too, names local indexes that hold filelock and
friends). Stand-ins (each says STAND-IN in its text) only for what cannot be had here: GPU
tools, sudo and the package system (tests/test_cli_setup.py's), a Miniconda installer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, error_in, install_standin, standin_miniconda
from test_cli_setup import T4_LSPCI, _calls, _last_run, _package_world, _wipe
from testbed import NetnsBed, TestHost

from vmrun.cli.setup_view import conda_channels_note

PROBE_FILES = ("probe", "ran-fetch", "ran-build", "ran-lint")


@pytest.fixture
def hosts(bed: NetnsBed) -> Iterator[list[TestHost]]:
    """h1-h3 with no vmrun state and none of this file's probes, before and after."""
    chosen = [bed[n] for n in ("h1", "h2", "h3")]

    def clean() -> None:
        for host in chosen:
            _wipe(host)
            for name in PROBE_FILES:
                target = host.home / name
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink(missing_ok=True)

    clean()
    yield chosen
    clean()


def _probe_wheel(folder: Path, name: str, version: str = "1.0") -> Path:
    """A minimal, valid pure-Python wheel of package `name` (module `name` with _ for -)."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: vmrun-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def _give(host: TestHost, path: Path) -> None:
    """Make a tree the test wrote into a host's home that host user's own."""
    for p in [path, *path.rglob("*")]:
        os.chown(p, host.uid, host.gid)


def _env_python(host: TestHost, name: str = "vmrun") -> Path:
    return host.home / ".vmrun" / "envs" / name / "bin" / "python"


def _installed(host: TestHost, python: Path, module: str) -> str:
    """Where `module` imports from in that interpreter on the host ('' if it does not)."""
    done = host.run(
        [str(python), "-c", f"import {module} as m; print(m.__file__)"],
        as_user=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


# -- 1. --force and --only ------------------------------------------------------------

COUNTING_BOOK = """
name: counting
steps:
  - name: fetch
    apply: echo run >> "$HOME/ran-fetch"
  - name: build
    needs: [fetch]
    apply: echo run >> "$HOME/ran-build"
  - name: lint
    check: test -s "$HOME/ran-lint"
    apply: echo run >> "$HOME/ran-lint"
"""


def _runs(host: TestHost) -> dict[str, int]:
    """How many times each step of COUNTING_BOOK really ran on the host."""
    counts = {}
    for step in ("fetch", "build", "lint"):
        path = host.home / f"ran-{step}"
        counts[step] = len(path.read_text().splitlines()) if path.exists() else 0
    return counts


def test_force_reruns_a_done_step_and_its_dependents_and_only_narrows_to_one_step(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    h1 = hosts[0]
    book = tmp_path / "counting.yaml"
    book.write_text(COUNTING_BOOK)

    def setup(*args: str) -> str:
        done = bed_client.vmrun("setup", "h1", "--playbook", str(book), *args)
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    # --only on a fresh host: that step alone, its needs are not pulled in
    out = setup("--only", "lint")
    assert "ran 1 (lint), 0 already done" in out, out
    assert _runs(h1) == {"fetch": 0, "build": 0, "lint": 1}
    out = setup()
    assert "ran 2 (fetch, build), 1 already done" in out, out
    assert _runs(h1) == {"fetch": 1, "build": 1, "lint": 1}
    assert "ran 0 (nothing), 3 already done" in setup()

    # --force: a done step runs again, and the step that needs it; the independent one not
    plan = setup("--force", "fetch", "--dry-run")
    assert "would run fetch (forced)" in plan and "would run build (after fetch)" in plan, plan
    assert "skip lint: check passes" in plan
    assert _runs(h1) == {"fetch": 1, "build": 1, "lint": 1}  # the dry run ran nothing
    out = setup("--force", "fetch")
    assert "ran 2 (fetch, build), 1 already done" in out, out
    assert _runs(h1) == {"fetch": 2, "build": 2, "lint": 1}
    out = setup("--force", "lint")  # a step whose check passes, and nothing needs it
    assert "ran 1 (lint), 2 already done" in out, out
    assert _runs(h1) == {"fetch": 2, "build": 2, "lint": 2}

    # --only with --force: just that step; the step that needs it catches up on the next run
    out = setup("--only", "fetch", "--force", "fetch")
    assert "ran 1 (fetch), 0 already done" in out, out
    assert _runs(h1) == {"fetch": 3, "build": 2, "lint": 2}
    plan = setup("--dry-run")
    assert "would run build (inputs changed)" in plan and "skip fetch: done before" in plan, plan
    out = setup()
    assert "ran 1 (build), 2 already done" in out, out
    assert _runs(h1) == {"fetch": 3, "build": 3, "lint": 2}

    # an unknown step is a usage error before any connection
    bad = bed_client.vmrun("setup", "h1", "--playbook", str(book), "--force", "fetsh")
    assert bad.returncode != 0
    code, said = error_in(bad.stderr)
    assert code == "bad-config" and "'fetsh'" in said and "fetch, build, lint" in said, said
    assert _runs(h1) == {"fetch": 3, "build": 3, "lint": 2}


# -- 2. extra steps: --extra FILE and [[setup.steps]] ---------------------------------


def test_extra_steps_apt_present_skips_without_sudo_and_pip_installs_from_the_wheelhouse(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    """The default playbook plus an `apt:` step from vmrun.toml (coreutils: installed, so it
    is adopted with no sudo and no network; the hosts have neither) and a `pip:` step from
    --extra, installed into the env from the uploaded wheelhouse."""
    h2 = hosts[1]
    (bed_client.cwd / "vmrun.toml").write_text(
        '[[setup.steps]]\nname = "tools"\napt = ["coreutils"]\n'
    )
    extra = tmp_path / "extra.yaml"
    extra.write_text("steps:\n  - name: reqs\n    pip: [vmrun-probe-wheelhouse]\n")
    wheels = tmp_path / "wheels"
    _probe_wheel(wheels, "vmrun-probe-wheelhouse")
    args = [
        "setup",
        "h2",
        "--extra",
        str(extra),
        "--wheelhouse",
        str(wheels),
        "--only",
        "python-env",
        "--only",
        "reqs",
        "--only",
        "tools",
    ]

    plan = bed_client.vmrun(*args, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "skip tools: already present" in plan.stdout, plan.stdout
    assert "would run reqs (not done yet)" in plan.stdout
    assert (
        f"# VMRUN_PIP_EXTRA_ARGS=--no-index --find-links {h2.home}/.vmrun/wheelhouse" in plan.stdout
    )
    apply = 'vmrun_pip_install "$VMRUN_PYTHON" $VMRUN_PIP_EXTRA_ARGS vmrun-probe-wheelhouse'
    assert apply in plan.stdout
    assert "needs passwordless sudo" not in plan.stdout and "note:" not in plan.stdout

    first = bed_client.vmrun(*args, timeout=300)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "h2: ok in" in first.stdout
    assert "ran 2 (python-env, reqs), 1 already done" in first.stdout, first.stdout
    python = _env_python(h2)
    assert _installed(h2, python, "vmrun_probe_wheelhouse").startswith(
        f"{h2.home}/.vmrun/envs/vmrun/lib/"
    )
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h2.log")
    assert (
        "Successfully installed vmrun-probe-wheelhouse-1.0" in log
        or "Successfully installed vmrun_probe_wheelhouse-1.0" in log
    ), log
    state = json.loads((h2.home / ".vmrun" / "setup" / "state.json").read_text())
    assert {"python-env", "reqs", "tools"} <= set(state["steps"])

    again = bed_client.vmrun(*args)
    assert again.returncode == 0, again.stderr
    assert "ran 0 (nothing), 3 already done" in again.stdout, again.stdout

    # the env lost the package (remade by another manager, say): its check sees it, and the
    # pip step runs again although its fingerprint did not change
    h2.run(
        [str(python), "-m", "pip", "uninstall", "-y", "-q", "vmrun-probe-wheelhouse"], as_user=True
    )
    assert _installed(h2, python, "vmrun_probe_wheelhouse") == ""
    third = bed_client.vmrun(*args)
    assert third.returncode == 0, third.stderr
    assert "ran 1 (reqs), 2 already done" in third.stdout, third.stdout
    assert _installed(h2, python, "vmrun_probe_wheelhouse")


# -- 3. parameter layers ----------------------------------------------------------------


def test_parameter_layers_defaults_config_files_environment_flags(
    bed_client: Client, hosts: list[TestHost]
) -> None:
    """defaults < [setup] in ~/.config/vmrun/config.toml < [setup] in vmrun.toml
    < VMRUN_SETUP_* < flags and --param, as the dry run's resolved values show."""
    h3 = hosts[2]
    user_config = bed_client.home / ".config" / "vmrun" / "config.toml"
    user_config.parent.mkdir(parents=True)
    user_config.write_text(
        '[setup]\npython_version = "3.10"\nenv_name = "from-user"\ntorch = "torch==1.0"\n'
    )
    (bed_client.cwd / "vmrun.toml").write_text(
        '[setup]\nenv_name = "from-project"\ntorch = "torch==2.0"\npip = "from-project"\n'
    )
    environ = {
        "VMRUN_SETUP_TORCH": "torch==3.0",
        "VMRUN_SETUP_PIP": "from-env",
        "VMRUN_SETUP_CONDA_CHANNELS": "defaults",
    }
    done = bed_client.vmrun(
        "setup",
        "h3",
        "--dry-run",
        "--pip",
        "from-flag",
        "--param",
        "conda_channels=conda-forge",
        env=environ,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    python = f"{h3.home}/.vmrun/envs/from-project/bin/python"
    assert f"python {python}" in out, out
    assert "# VMRUN_ENV=venv" in out  # nobody set it: the playbook's default
    assert "# VMRUN_TORCH=torch==3.0" in out  # the environment over both files
    assert "# VMRUN_PIP=from-flag" in out  # a flag over the environment
    assert "would run extra-packages (never ran)" in out
    # the dry run shows only the env manager's branch: conda's uses these three
    conda = bed_client.vmrun(
        "setup",
        "h3",
        "--dry-run",
        "--env-manager",
        "conda",
        "--param",
        "conda_channels=conda-forge",
        env=environ,
    )
    assert conda.returncode == 0, conda.stderr
    out = conda.stdout
    assert "# VMRUN_PYTHON_VERSION=3.10" in out  # the user's config over the default
    assert "# VMRUN_ENV_NAME=from-project" in out  # the project's file over the user's
    assert "# VMRUN_CONDA_CHANNELS=conda-forge" in out  # --param over the environment

    # each layer names itself when it sets something the playbook does not have
    bad = bed_client.vmrun("setup", "h3", "--dry-run", env={"VMRUN_SETUP_TOCH": "x"})
    assert bad.returncode != 0
    code, said = error_in(bad.stderr)
    assert code == "usage" and "'toch' (from environment)" in said, said
    user_config.write_text('[setup]\ntorch_version = "2"\n')
    bad = bed_client.vmrun("setup", "h3", "--dry-run")
    assert bad.returncode != 0
    code, said = error_in(bad.stderr)
    assert code == "usage" and "'torch_version' (from [setup] in " in said, said


# -- 4. --index-url and --find-links --------------------------------------------------


def test_index_url_and_find_links_pass_through_to_pip(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    """A package only the given index has and one only the given links folder has: pip
    finds both, so both options reached it; torch's plan carries them too."""
    h1 = hosts[0]
    probe = h1.home / "probe"
    index_wheel = _probe_wheel(probe / "files", "vmrun-probe-index")
    page = probe / "simple" / "vmrun-probe-index" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="file://{index_wheel}">{index_wheel.name}</a>\n')
    _probe_wheel(probe / "links", "vmrun-probe-links")
    _give(h1, probe)
    index, links = f"file://{probe}/simple/", f"{probe}/links"
    common = [
        "setup",
        "h1",
        "--index-url",
        index,
        "--find-links",
        links,
        "--pip",
        "vmrun-probe-index vmrun-probe-links",
    ]

    plan = bed_client.vmrun(*common, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    # the user's index replaces the CPU wheel index torch would get otherwise
    assert f"# VMRUN_PIP_INDEX_ARGS=--find-links {links} --index-url {index}\n" in plan.stdout
    assert f"# VMRUN_PIP_EXTRA_ARGS=--find-links {links} --index-url {index}\n" in plan.stdout
    assert "download.pytorch.org" not in plan.stdout

    done = bed_client.vmrun(
        *common, "--only", "python-env", "--only", "extra-packages", timeout=300
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "ran 2 (python-env, extra-packages)" in done.stdout, done.stdout
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h1.log")
    assert f"Looking in indexes: {index}" in log, log
    assert f"Looking in links: {links}" in log
    python = _env_python(h1)
    for module in ("vmrun_probe_index", "vmrun_probe_links"):
        assert _installed(h1, python, module).startswith(f"{h1.home}/.vmrun/envs/vmrun/lib/")


# -- 5. the nouveau guidance ------------------------------------------------------------

NOUVEAU_SMI = """# a driver is installed, but nouveau holds the GPU: what nvidia-smi says then
echo "No devices were found"
exit 6
"""


def test_no_devices_found_gets_the_nouveau_guidance(
    bed_client: Client, hosts: list[TestHost], host_python: Path
) -> None:
    h3 = hosts[2]
    _package_world(h3)  # stand-ins for sudo, apt-get, dpkg-query, ubuntu-drivers
    install_standin(h3, "lspci", T4_LSPCI)
    install_standin(h3, "nvidia-smi", NOUVEAU_SMI)
    done = bed_client.vmrun("setup", "h3", "--python", str(host_python), "--only", "nvidia-driver")
    assert done.returncode == 1, done.stderr + done.stdout
    code, said = error_in(done.stderr)
    assert code == "setup-step-failed" and "h3: step nvidia-driver" in said, done.stderr
    assert "blacklist nouveau" in said and "update-initramfs -u" in said  # what to run
    assert "ubuntu-drivers install --gpgpu" in _calls(h3)  # the install itself went through
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h3.log")
    assert "No devices were found" in log
    state = h3.home / ".vmrun" / "setup" / "state.json"
    assert not state.exists() or "nvidia-driver" not in json.loads(state.read_text())["steps"]


# -- 6. conda: conda-forge, or Anaconda's defaults with their terms accepted ------------

STANDIN_MINICONDA = standin_miniconda("/usr/bin/python3", '"$HOME/probe/calls"')


def test_conda_uses_conda_forge_or_accepts_the_terms_for_the_default_channels(
    bed_client: Client, hosts: list[TestHost], tmp_path: Path
) -> None:
    h2 = hosts[1]
    (h2.home / "probe").mkdir()
    _give(h2, h2.home / "probe")
    installer = tmp_path / "Miniconda3-standin.sh"
    installer.write_text(STANDIN_MINICONDA)
    args = [
        "setup",
        "h2",
        "--env-manager",
        "conda",
        "--installer",
        str(installer),
        "--only",
        "python-env",
    ]
    log_path = bed_client.cwd / ".vmrun" / "logs" / "setup-h2.log"

    def calls() -> list[str]:
        return (h2.home / "probe" / "calls").read_text().splitlines()

    first = bed_client.vmrun(*args)
    assert first.returncode == 0, first.stderr + first.stdout
    prefix = f"{h2.home}/miniconda3"
    assert calls() == [
        f"installer -b -u -p {prefix}",
        "conda create -y -n vmrun --override-channels -c conda-forge python=3.12 pip",
    ]
    assert conda_channels_note("conda-forge") in first.stdout, first.stdout
    assert "conda-forge only (--override-channels): no Anaconda ToS involved" in _last_run(log_path)

    second = bed_client.vmrun(*args, "--param", "conda_channels=defaults")
    assert second.returncode == 0, second.stderr + second.stdout
    assert "ran 1 (python-env)" in second.stdout, second.stdout
    assert calls()[2:] == [  # conda is there now: no second install
        "conda env remove -y -n vmrun",  # the env is made again, from the other channels
        "conda tos accept --override-channels --channel https://repo.anaconda.com/pkgs/main",
        "conda tos accept --override-channels --channel https://repo.anaconda.com/pkgs/r",
        "conda create -y -n vmrun python=3.12 pip",
    ]
    assert conda_channels_note("defaults") in second.stdout, second.stdout
    assert "accepting Anaconda's Terms of Service for the default channels" in _last_run(log_path)
    assert conda_channels_note("defaults") != conda_channels_note("conda-forge")
