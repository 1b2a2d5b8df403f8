"""`train --fsdp` over several nodes needs numpy on each (torch.distributed.checkpoint's save
over several ranks): the host's probe says whether its Python finds numpy, and a node
without it is refused before anything starts, naming the fix (`vmrun setup`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vmrun.backends.hosts.preflight import check_numpy
from vmrun.errors import UsageError

PROBE = Path(__file__).resolve().parent.parent / "vmrun" / "hostside" / "netprobe.py"
NO_NUMPY = Path("/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python")  # the hosts' default


def _facts(python: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(PROBE), "facts", "--versions"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_probe_says_whether_the_python_finds_numpy() -> None:
    import importlib.util

    assert _facts(sys.executable)["numpy"] is (importlib.util.find_spec("numpy") is not None)
    if not NO_NUMPY.exists():
        pytest.skip(f"{NO_NUMPY} is built by the suite's host fixtures (.ci/run)")
    assert _facts(str(NO_NUMPY))["numpy"] is False


def _node(numpy: object, image: object = None) -> Any:
    return SimpleNamespace(
        entry=SimpleNamespace(label="h2"),
        env=SimpleNamespace(python="/venv/bin/python"),
        facts=SimpleNamespace(data={"torch": "2.13.0", "numpy": numpy}),
        image=image,
    )


def test_fsdp_without_numpy_is_refused_naming_setup() -> None:
    plan: Any = SimpleNamespace(is_template=True, args=["4", "2", "--fsdp"])
    with pytest.raises(UsageError) as caught:
        check_numpy(plan, _node(False))
    err = caught.value
    assert err.code == "numpy-missing" and err.host == "h2"
    assert "numpy is not importable by /venv/bin/python" in err.message
    assert "nothing was started" in err.message and "vmrun setup h2" in (err.hint or "")
    check_numpy(plan, _node(True))  # has it
    check_numpy(plan, _node(None))  # an older probe's facts: not judged
    check_numpy(plan, _node(False, image=object()))  # the image's Python, not the host's
    check_numpy(SimpleNamespace(is_template=True, args=["4", "2"]), _node(False))  # no --fsdp
    check_numpy(SimpleNamespace(is_template=False, args=["--fsdp"]), _node(False))  # a script's


def test_train_fsdp_on_two_hosts_without_numpy_starts_nothing(
    bed: Any, bed_client: Any, host_python: Path
) -> None:
    """The suite's default host interpreter has torch and no numpy: refused before the start,
    one line naming the fix, and no run recorded on either host."""
    entry = '[[hosts]]\naddress = "{}"\npython = "{}"\n\n'
    (bed_client.cwd / "vmrun.toml").write_text(
        "".join(entry.format(h, host_python) for h in ("h1", "h2"))
    )
    done = bed_client.vmrun(
        *("train", "--fsdp", "-H", "h1", "-H", "h2", "--nproc-per-node", "1", "--epochs", "1"),
        timeout=180,
    )
    assert done.returncode == 2, done.stderr + done.stdout
    assert "error[numpy-missing]" in done.stderr, done.stderr
    assert f"numpy is not importable by {host_python}" in done.stderr
    assert "nothing was started" in done.stderr and "vmrun setup" in done.stderr
    for host in ("h1", "h2"):
        assert not list((bed[host].home / ".vmrun" / "runs").glob("r-*")), host
