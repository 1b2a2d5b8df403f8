"""The walk of one train plan through the code: which modules (rooms) a started run passes
through, from the call of `run_remote` (`--entry`) with the Plan of `vmrun train -H h1
--detach` until that call returns, and how many calls between modules climb back up the layers.

    python benchmarks/plan_walk.py [--tree CHECKOUT]

`--tree`: measure another checkout of vmrun (an older commit, to compare), read with that
checkout's own layer contract from its pyproject.toml. Every call between vmrun's modules in
that window is counted (threads too); a climb is a caller-to-callee pair of modules whose
callee is in a higher layer (an object handed down from above, such as the CLI's `Terminal`).
Needs root (a network-namespace test host) and the test cache's interpreter with torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"

# Runs in the CLI's process: records each call whose frame holds the run's Plan.
TRACER = r"""
import json, sys, threading
edges = {}
walk = []  # (caller, callee, function) of each call that takes the Plan, in order
window = []  # the frame of the first call that took the Plan, while it runs
def _has_plan(frame):
    for value in frame.f_locals.values():
        kind = type(value)
        if kind.__name__ == "Plan" and kind.__module__.startswith("vmrun."):
            return True
    return False
def _caller(frame):
    back = frame.f_back
    while back is not None and not back.f_globals.get("__name__", "").startswith("vmrun."):
        back = back.f_back
    return back.f_globals.get("__name__", "") if back is not None else ""
def _profile(frame, event, arg):
    module = frame.f_globals.get("__name__", "")
    if not module.startswith("vmrun."):
        return
    if event == "return" and window and frame is window[0]:
        window.append(None)
        return
    if event != "call" or len(window) > 1:
        return
    if not window:
        if frame.f_code.co_name != sys.argv[2] or not _has_plan(frame):
            return
        window.append(frame)
    key = (_caller(frame), module)
    edges[key] = edges.get(key, 0) + 1
    if _has_plan(frame) and module != "vmrun.runs.plan":
        walk.append([key[0], module, frame.f_code.co_name])
sys.setprofile(_profile)
threading.setprofile(_profile)
from vmrun.cli.main import main
try:
    main(sys.argv[3:])
except SystemExit:
    pass
finally:
    sys.setprofile(None)
    with open(sys.argv[1], "w") as fh:
        json.dump({"edges": [[a, b, n] for (a, b), n in edges.items()], "walk": walk}, fh)
"""


def layers_of(tree: Path) -> list[list[str]]:
    from vmrun.config import tomllib

    data = tomllib.loads((tree / "pyproject.toml").read_text())
    for contract in data["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]
    raise SystemExit("plan_walk: no layers contract in pyproject.toml")


def rank(module: str, layers: list[list[str]]) -> int:
    best, depth = len(layers), -1
    for i, layer in enumerate(layers):
        for name in layer:
            if (module == name or module.startswith(name + ".")) and len(name) > depth:
                best, depth = i, len(name)
    return best


def walk(edges: list[list], layers: list[list[str]]) -> dict[str, object]:
    """Rooms: the modules entered; climbs: the caller-to-callee module pairs that go up the
    layers (a callback into a caller's module counts); edges: all such distinct pairs."""
    rooms = sorted({callee for _, callee, _ in edges})
    pairs = {(caller, callee) for caller, callee, _ in edges if caller and caller != callee}
    up = sorted(f"{a} -> {b}" for a, b in pairs if rank(b, layers) < rank(a, layers))
    return {"rooms": len(rooms), "climbs": len(up), "edges": len(pairs), "path": rooms, "up": up}


def plan_walk(calls: list[list[str]], layers: list[list[str]]) -> dict[str, object]:
    """The Plan's own walk: the modules whose functions take it (or close over it), in order.
    A climb is a call up the layers: a function handed down and called back from below (a
    fan-out's per-host function, run by vmrun.ssh.group). A re-entry is a direct call into a
    room the plan first entered from elsewhere: it went up the house and came down again."""
    rooms: list[str] = []
    first_from: dict[str, str] = {}
    climbs = reentries = 0
    steps = []
    for caller, callee, function in calls:
        if callee == caller:
            continue
        steps.append(f"{callee}.{function}")
        if caller and rank(callee, layers) < rank(caller, layers):
            climbs += 1
        elif first_from.setdefault(callee, caller) != caller:
            reentries += 1
        if callee not in rooms:
            rooms.append(callee)
    return {"rooms": len(rooms), "climbs": climbs, "reentries": reentries, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--python", default=CACHED_PYTHON)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--entry", default="run_remote", help="the function that takes the plan")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("plan_walk: needs root (a network-namespace test host)")
    if not Path(args.python).exists():
        raise SystemExit(f"plan_walk: no {args.python}: run the test suite once to build it")
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="vmrun-walk-") as tmp:
        work = Path(tmp)
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed:
            bed.add_host("h1")
            _, project, env = client_dirs(bed, work)
            env["PYTHONPATH"] = str(tree)
            (project / "vmrun.toml").write_text(
                f'[[hosts]]\naddress = "h1"\npython = "{args.python}"\n'
            )
            out = work / "calls.json"
            argv = [
                sys.executable,
                "-c",
                TRACER,
                str(out),
                args.entry,
                "train",
                "-H",
                "h1",
                "--detach",
                "--",
                "1",
                "1",
            ]
            done = subprocess.run(
                argv, cwd=project, env=env, capture_output=True, text=True, timeout=300
            )
            if not out.exists() or "started" not in done.stderr + done.stdout:
                sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
                raise SystemExit("plan_walk: the train did not start (see above)")
            traced = json.loads(out.read_text())
    layers = layers_of(tree)
    result = walk(traced["edges"], layers)
    own = plan_walk(traced["walk"], layers)
    result["plan"] = own
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"the plan's own walk: rooms {own['rooms']}, climbs {own['climbs']},"
        f" re-entries {own['reentries']}"
    )
    for step in own["steps"]:  # type: ignore[attr-defined]
        print(f"  {step}")
    print(
        f"everything it calls: rooms {result['rooms']}, climbs {result['climbs']},"
        f" module pairs {result['edges']}"
    )
    for room in result["path"]:  # type: ignore[attr-defined]
        print(f"  {room}")
    for climb in result["up"]:  # type: ignore[attr-defined]
        print(f"  climb: {climb}")


if __name__ == "__main__":
    main()
