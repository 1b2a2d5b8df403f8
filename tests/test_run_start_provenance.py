"""The start's part in a run's provenance (run_start.sh and its agent), run here with a
temporary HOME: the diff that came in the launch spec lands in code.patch (a large one, cut
to the environment's limit, goes through every exec of the start), the collector runs beside
the run, and neither the diff nor the spec reach the run's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import install_hostlib, wait_for

from vmrun.runs import provenance
from vmrun.runs.launch_spec import LAUNCH_VAR, LaunchSpec, Provenance, Watchers

SECRET = "s3cret-0a1b2c3d-not-recorded"


def test_the_diff_and_the_collector_go_beside_the_run_and_not_into_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lib = install_hostlib(home)
    diff = "".join(f"+x = {os.urandom(40).hex()!r}\n" for _ in range(8000)).encode()
    sent = provenance.encode_patch(diff)
    assert len(sent) > 64 << 10  # near the limit: every exec of the start carries it
    spec = LaunchSpec(
        rec=".vmrun/runs/r1",
        workdir=str(home),
        run_id="r1",
        argv=("sh", "-c", 'env > "$VMRUN_RUN_DIR/run-env.txt"'),
        meta=json.dumps({"id": "r1", "variables": {"TOKEN": None}}),
        env={"TOKEN": SECRET},
        out="out",
        watchers=Watchers(provenance=Provenance(sys.executable, sent)),
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(home), **spec.header()}
    started = subprocess.run(
        ["sh", str(lib / "run_start.sh")],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode == 0, started.stderr
    rec = home / ".vmrun" / "runs" / "r1"
    wait_for(lambda: (rec / "exit_code").exists(), 20, "the run's end")
    wait_for(lambda: (rec / "versions.json").exists(), 20, "the collector's files")
    assert (rec / "code.patch").read_bytes() == provenance.sent_patch(diff)
    assert (rec / "code.patch").read_bytes().endswith(provenance.CUT_MARK)
    ran_with = (rec / "run-env.txt").read_text()
    assert SECRET in ran_with  # the run has its variable...
    assert f"{LAUNCH_VAR}=" not in ran_with and sent[:64] not in ran_with  # ...not the spec
    facts = json.loads((rec / "provenance.json").read_text())
    assert facts["environment"]["python"]["executable"] == sys.executable
    leaks = [
        p.name
        for p in rec.iterdir()
        if p.is_file() and p.name != "run-env.txt" and SECRET in p.read_text()
    ]
    assert not leaks, leaks  # ...which nothing else vmrun wrote holds
