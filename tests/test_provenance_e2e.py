"""What made a run, recorded and brought back (vmrun.runs.provenance, hostside/run_provenance.py),
end to end on real sshd test hosts: a git project with an uncommitted change, a host whose
torch differs, a secret --env value that must be written nowhere, and `vmrun diff`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, git, run_id_of, wait_for
from testbed import NetnsBed

from vmrun.remote_paths import remote_workdir

SECRET = "tok-5f1e2d3c4b5a-never-written"
SCRIPT = "import os\nprint('epoch 1/1', 'token set' if os.environ.get('TOKEN') else 'no token')\n"


def _old_torch_python(where: Path) -> Path:
    """A venv whose torch is 2.12.0 by its metadata (no torch code: the script does not
    import it); what a host set up with another torch looks like to the record."""
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--without-pip", str(where)], check=True, timeout=60
    )
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(
        subprocess.run(
            [str(where / "bin" / "python"), "-c", purelib],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('a record of torch only')\n")
    (site / "torch" / "version.py").write_text(
        "__version__ = '2.12.0'\ncuda = None\nhip = None\ngit_version = 'old'\n"
    )
    info = site / "torch-2.12.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return where / "bin" / "python"


@pytest.fixture
def project(bed: NetnsBed, bed_client: Client, host_python: Path) -> Iterator[Client]:
    """A git project: train.py committed, then changed (uncommitted) and a new file beside
    it; h1 runs the shared interpreter, h2 one whose torch is older."""
    h2 = bed["h2"]
    old = _old_torch_python(h2.home / "old-torch")
    cwd = bed_client.cwd
    (cwd / "train.py").write_text(SCRIPT)
    git(cwd, "init", "-q")
    git(cwd, "add", "train.py")
    git(cwd, "commit", "-qm", "first")
    (cwd / "train.py").write_text(SCRIPT + "print('an uncommitted line')\n")
    (cwd / "notes.md").write_text("untracked\n")
    (cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{host_python}"\n\n'
        f'[[hosts]]\naddress = "h2"\npython = "{old}"\n'
    )
    bed_client.extra_env["TOKEN"] = SECRET
    yield bed_client
    for name in ("h1", "h2"):
        clean_host(bed[name])
    shutil.rmtree(h2.home / "old-torch", ignore_errors=True)


def _train(client: Client, host: str) -> str:
    done = client.vmrun("train", "-H", host, "--launcher", "python", "-e", "TOKEN", "train.py")
    assert done.returncode == 0, done.stderr
    assert "token set" in done.stdout  # the run had the secret in its environment
    return run_id_of(done.stderr)


def _files_with(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
        except OSError:
            continue
    return found


def test_a_dirty_git_run_records_code_environment_hardware_and_diff_names_the_torch(
    bed: NetnsBed, project: Client, host_python: Path
) -> None:
    head = git(project.cwd, "rev-parse", "HEAD")
    a, b = _train(project, "h1"), _train(project, "h2")
    records = {a: bed["h1"].home / ".vmrun" / "runs" / a, b: bed["h2"].home / ".vmrun" / "runs" / b}
    for rid, rec in records.items():  # written beside the run, after its start
        wait_for(lambda rec=rec: (rec / "versions.json").exists(), 30, f"{rid}'s provenance")

    for rid, host in ((a, "h1"), (b, "h2")):
        fetched = project.vmrun("fetch", "results", "-H", host, "--run", rid)
        assert fetched.returncode == 0, fetched.stderr
    here = project.cwd / "results" / a
    meta = json.loads((here / "run.json").read_text())
    code = meta["code"]
    assert (code["commit"], code["dirty"]) == (head, True) and "notes.md" in code["untracked"]
    assert "+print('an uncommitted line')" in (here / "code.patch").read_text()
    assert meta["variables"]["TOKEN"] is None  # its name, never its value
    assert meta["variables"]["PYTHONUNBUFFERED"] == "1"
    facts = json.loads((here / "provenance.json").read_text())
    assert facts["environment"]["python"]["executable"] == str(host_python)
    assert facts["hardware"]["cpu"]["count"] == os.cpu_count()
    assert facts["hardware"]["memory_bytes"] > 0 and facts["hardware"]["gpus"] == []
    assert facts["hardware"]["hostname"] == bed["h1"].hostname
    torch = facts["environment"]["packages"]["torch"]
    assert f"torch=={torch}" in (here / "environment.txt").read_text()

    # the same code on both: the diff names the torch and the host, not the code
    diff = project.vmrun("diff", a, b, "--json")
    assert diff.returncode == 0, diff.stderr
    (pair,) = json.loads(diff.stdout)["diffs"]
    assert pair["packages"]["changed"]["torch"] == [torch, "2.12.0"]
    assert not pair["code"], pair["code"]
    assert any(c["what"] == "hosts" for c in pair["launch"]), pair["launch"]
    assert not pair["hardware"], pair["hardware"]  # two test hosts of one machine
    text = project.vmrun("report", a, b, "--diff")
    assert text.returncode == 0 and f"~ torch {torch} -> 2.12.0" in text.stdout, text.stderr

    # status --json carries the commit and the main versions, for grouping runs
    listed = json.loads(project.vmrun("status", "-H", "h1", "--json").stdout)
    (obj,) = [o for o in listed if o["run"] == a]
    assert (obj["commit"], obj["dirty"]) == (head, True)
    assert obj["versions"]["torch"] and obj["versions"]["python"]

    # nothing of the secret in any file the runs left, on the hosts or here
    places = [*records.values(), project.cwd, project.home]
    places += [bed[h].home / remote_workdir(project.cwd) for h in ("h1", "h2")]
    leaks = [p for place in places for p in _files_with(place, SECRET.encode())]
    assert not leaks, leaks
