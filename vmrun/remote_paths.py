"""Where vmrun keeps things on a host, spelled once.

Paths are relative to the remote user's home (commands run from it, and scripts on the host
get them as arguments), so one host's layout never depends on this machine's. Nothing here
does I/O on a host; `remote_workdir` only hashes a local path.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

STATE_DIR = ".vmrun"  # everything vmrun keeps on a host, but the code it syncs
RUNS_DIR = f"{STATE_DIR}/runs"  # one folder per run: run.json, pid, log, exit_code, workers/
HOST_RECORD = f"{STATE_DIR}/host.json"  # the environment setup made: python, torch, gpus
SETUP_DIR = f"{STATE_DIR}/setup"  # setup's state.json (step fingerprints), reboot marks
SETUP_STATE = f"{SETUP_DIR}/state.json"
SETUP_APT_MARK = f"{SETUP_DIR}/apt-updated"  # the setup run that last ran `apt-get update`
SETUP_REBOOT_RC = f"{SETUP_DIR}/reboot.rc"  # the reboot command's exit status, once it ended
SETUP_REBOOT_OUT = f"{SETUP_DIR}/reboot.out"  # and its output
TOOLS_DIR = f"{STATE_DIR}/tools"  # tools setup installs for itself (uv)
LIB_DIR = f"{STATE_DIR}/lib"  # vmrun's own scripts placed there (the template trainer)
BIN_DIR = f"{STATE_DIR}/bin"  # first on the PATH of every command vmrun runs there
WHEELHOUSE = f"{STATE_DIR}/wheelhouse"  # setup --wheelhouse uploads
INSTALLERS = f"{STATE_DIR}/installers"  # setup --installer uploads
ENVS_DIR = f"{STATE_DIR}/envs"  # environments setup builds (venv, uv, conda prefixes)
WORK_ROOT = "vmrun"  # projects' synced code: vmrun/<name>-<hash>/
ACTIVE_DIR = f"{STATE_DIR}/active"  # a marker per live vmrun command (autostop: activity)
RUN_ENV = "VMRUN_RUN_ID"  # carried by every process of a run: how stop and watch find them
# Where nvidia-smi lives besides sshd's default PATH: NVIDIA's container/GKE layout and WSL.
NVIDIA_PATH = "/usr/local/nvidia/bin:/usr/lib/wsl/lib"
# The autostop watchdog (vmrun.autostop): its script, its settings (read every tick), its
# state (what `autostop --status`, `status` and `watch-gpus` show) and its decisions' log.
CONTAINER_HOME = f"{STATE_DIR}/container-home"  # HOME inside a run's container (its caches)
AUTOSTOP_SCRIPT = f"{LIB_DIR}/autostop_watch.sh"
AUTOSTOP_CONF = f"{STATE_DIR}/autostop.conf"
AUTOSTOP_STATE = f"{STATE_DIR}/autostop.state"
# the watchdog's warning notification: its 0600 notify.json and a copy of notify_send.py
AUTOSTOP_NOTIFY = f"{STATE_DIR}/autostop-notify"
AUTOSTOP_LOG = f"{STATE_DIR}/autostop.log"


def run_dir(run_id: str) -> str:
    """A run's record folder (the id is checked by the caller: vmrun.backends.hosts.records)."""
    return f"{RUNS_DIR}/{run_id}"


def remote_workdir(project: Path) -> str:
    """`vmrun/<dir name slug>-<6 hex of sha256(absolute path)>` relative to the remote home:
    stable per local project, no collisions between two projects of the same name.
    VMRUN_HOST_WORKDIR names it instead: a run's supervisor (vmrun.recovery) works from a
    copy of the project elsewhere, on the folder the run was started in."""
    given = os.environ.get("VMRUN_HOST_WORKDIR", "").strip()
    if given:
        return given
    path = Path(os.path.abspath(project)).resolve()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name).strip("-.")[:40].strip("-.")
    digest = hashlib.sha256(os.fsencode(str(path))).hexdigest()[:6]
    return f"{WORK_ROOT}/{slug or 'project'}-{digest}"
