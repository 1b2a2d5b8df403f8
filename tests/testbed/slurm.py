"""SlurmCluster: a real Slurm (munged, slurmctld, slurmd) on hosts of a NetnsBed.

One login host runs ``munged`` and ``slurmctld``; N compute hosts run one ``slurmd``
each.  Every host is an ordinary bed host (own netns, hostname, user, sshd), so a test
user reaches the login host over real SSH and submits there with sbatch/srun.

* **Config**: ``slurm.conf``, ``gres.conf``, ``cgroup.conf`` are written into
  ``/etc/netns/<ns>/slurm/`` of every host *before* its sshd starts (an sshd's mount
  namespace, which its sessions inherit, is made when it starts); ``ip netns exec``
  bind-mounts that directory over ``/etc/slurm``, so the daemons, SSH sessions and job
  steps all read it at the default path, without ``SLURM_CONF``.  The machine's own
  ``/etc/slurm``, ``/etc/munge`` and ``/run/munge`` are never touched.
* **Munge**: one ``munged`` and one key per cluster; its socket is a file in the
  cluster's dir, and pathname Unix sockets work across network namespaces (only
  abstract ones are per namespace).  slurm.conf names it (``AuthInfo=socket=``).
* **Shared filesystem**: every namespace sees the machine's one filesystem, so
  ``shared`` (owned by the login user) and the login user's home are shared the way an
  NFS home is on a real cluster: no bind mount is needed.  Jobs run as the login user,
  whose passwd entry (HOME = the login home) is the same on every host.
* **Processes**: every daemon runs in the foreground (``-F``/``-D``) through
  :meth:`TestHost.popen`, so the Popen pid *is* the daemon; they are stopped by pid.
  ``slurmstepd`` detaches from slurmd (jobs survive a slurmd restart), so close() also
  kills, by pid, what it finds in the cluster's namespaces (by executable) and the
  login user's processes on the compute hosts.  ``stop_sshd()`` on a host is a reboot:
  it takes that host's daemons with it.

Settings and facts behind them: README.md ("A Slurm cluster").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import TestbedError
from .files import mkdir_shared, write_text
from .layout import ETC_NETNS
from .netns import NetnsBed
from .procs import kill_until_gone, wait_until
from .slurmconf import (
    DAEMON_EXES,
    MUNGE,
    MUNGED,
    SLURMCTLD,
    SLURMD,
    ClusterPaths,
    Node,
    cgroup_conf,
    epilog,
    gres_conf,
    hosts_file,
    make_gpu_devices,
    skip_reason_no_slurm,
    slurm_conf,
    task_prolog,
    write_munge_key,
)
from .testhost import TestHost


class SlurmCluster:
    """A login host (munged + slurmctld) and ``computes`` compute hosts (one slurmd each),
    added to ``bed``; returns once every node is ``idle`` in ``sinfo``.

    Partitions: ``debug`` (default, every compute node) and ``one`` (the first only).
    ``enforce_part_limits`` is slurm.conf's EnforcePartLimits: with Slurm's default "NO" a
    job that asks for more nodes than its partition has stays PENDING for ever (reason
    PartitionNodeLimit); with "ALL" sbatch refuses it.  A context manager; close() is
    idempotent, and the bed's own close() remains the safety net.
    """

    def __init__(
        self,
        bed: NetnsBed,
        *,
        computes: int = 2,
        min_job_age: int = 300,
        enforce_part_limits: str = "NO",
        gpus_per_node: int = 2,
        cpus_per_node: int = 4,
        login_name: str = "login",
        compute_prefix: str = "c",
        timeout: float = 30.0,
    ) -> None:
        reason = skip_reason_no_slurm()
        if reason:
            raise TestbedError(reason)
        if computes < 1 or gpus_per_node < 1:
            raise ValueError("a cluster needs a compute host and a GPU per node")
        self.bed = bed
        self.paths = ClusterPaths(bed.home_root / bed.prefix / f"slurm-{login_name}")
        self.shared = bed.home_root / bed.prefix / f"shared-{login_name}"
        self._names = [login_name, *(f"{compute_prefix}{i}" for i in range(1, computes + 1))]
        self._settings: dict[str, Any] = {
            "min_job_age": min_job_age,
            "enforce_part_limits": enforce_part_limits,
            "gpus_per_node": gpus_per_node,
            "cpus_per_node": cpus_per_node,
        }
        self._hosts: list[TestHost] = []
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._closed = False
        started = time.monotonic()
        try:
            self._build(timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise
        self.started_in = time.monotonic() - started  # seconds, until every node was idle

    # ---------------------------------------------------------------- hosts, names, logs

    @property
    def login(self) -> TestHost:
        return self._hosts[0]

    @property
    def computes(self) -> list[TestHost]:
        return self._hosts[1:]

    @property
    def hosts(self) -> list[TestHost]:
        return list(self._hosts)

    @property
    def node_names(self) -> list[str]:
        """Slurm's node names: the compute hosts' hostnames (vmt-<name>)."""
        return [h.hostname for h in self.computes]

    @property
    def slurmctld_log(self) -> Path:
        return self.paths.slurmctld_log

    @property
    def munged_log(self) -> Path:
        return self.paths.munged_log

    def slurmd_log(self, node: str) -> Path:
        return self.paths.slurmd_log(node)

    def logs(self) -> list[Path]:
        """Every daemon's log, and what each printed on stdout/stderr (``*.out``)."""
        return sorted(self.paths.log_dir.glob("*"))

    def log_tails(self, chars: int = 1500) -> str:
        parts = []
        for log in self.logs():
            with contextlib.suppress(OSError):
                if text := log.read_text(errors="replace")[-chars:]:
                    parts.append(f"--- {log}\n{text}")
        return "\n".join(parts)

    def daemon_pids(self) -> dict[str, int]:
        """munged, slurmctld, slurmd-<node> -> the pid that was started."""
        return {what: proc.pid for what, proc in self._daemons}

    # ---------------------------------------------------------------- building

    def _etc_slurm(self, host_name: str) -> Path:
        return ETC_NETNS / f"{self.bed.prefix}-{host_name}" / "slurm"

    def etc_slurm(self, host: TestHost) -> Path:
        """The directory that is ``/etc/slurm`` inside ``host`` (its sessions, daemons and
        job steps): a file put here later shows there, on that host only."""
        return self._etc_slurm(host.name)

    def _build(self, timeout: float) -> None:
        paths = self.paths
        if paths.root.exists():
            raise TestbedError(f"{paths.root} exists: one cluster per login name and bed")
        for d in (paths.root, paths.munge_dir, paths.log_dir, paths.ctld_dir / "state"):
            mkdir_shared(d)
        mkdir_shared(paths.job_tmp)
        paths.job_tmp.chmod(0o1777)
        write_text(paths.task_prolog, task_prolog(paths), 0o755)
        write_text(paths.epilog, epilog(paths), 0o755)
        paths.munge_private.mkdir(mode=0o700)
        for name in self._names:  # before add_host: see the module docstring
            mkdir_shared(self._etc_slurm(name))
        for name in self._names:
            self._hosts.append(self.bed.add_host(name))
        login = Node(self.login.hostname, self.login.addr)
        nodes = [Node(h.hostname, h.addr) for h in self.computes]
        gpus = self._settings["gpus_per_node"]
        conf = slurm_conf(paths, login, nodes, **self._settings)
        for host in self._hosts:
            etc = self._etc_slurm(host.name)
            write_text(etc / "slurm.conf", conf)
            write_text(etc / "gres.conf", gres_conf(paths, gpus))
            write_text(etc / "cgroup.conf", cgroup_conf())
            write_text(etc / "plugstack.conf", "")  # the machine's is hidden by the bind mount
            # in place (same inode), so the running sshd's bind mount shows the new text
            write_text(ETC_NETNS / host.netns / "hosts", hosts_file(login, nodes))
        for node in self.node_names:
            mkdir_shared(paths.node_dir(node) / "spool")
        make_gpu_devices(paths, gpus)
        mkdir_shared(self.shared)
        os.chown(self.shared, self.login.uid, self.login.gid)
        write_munge_key(paths.munge_key)
        self._start_munged(timeout)
        self._start(self.login, "slurmctld", [SLURMCTLD, "-D"])
        # slurmds that start before slurmctld listens retry their registration a second later
        self._wait(self._ctld_up, timeout, "slurmctld to answer")
        for host in self.computes:
            self._start(host, f"slurmd-{host.hostname}", [SLURMD, "-D", "-N", host.hostname])
        self._wait(self.all_idle, timeout, "every node idle in sinfo")

    def _start(self, host: TestHost, what: str, argv: list[str]) -> None:
        """A daemon in the foreground inside ``host``; stdout/stderr to <log dir>/<what>.out."""
        with open(self.paths.log_dir / f"{what}.out", "ab") as out:
            proc = host.popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self._daemons.append((what, proc))

    def _start_munged(self, timeout: float) -> None:
        p = self.paths
        self._start(
            self.login,
            "munged",
            [
                MUNGED,
                "--foreground",
                f"--socket={p.munge_socket}",
                f"--key-file={p.munge_key}",
                f"--pid-file={p.munge_private / 'munged.pid'}",
                f"--seed-file={p.munge_private / 'munged.seed'}",
            ],
        )

        def answers() -> bool:
            if not p.munge_socket.exists():
                return False
            probe = self.login.run([MUNGE, "-n", "-S", str(p.munge_socket)], check=False)
            return probe.returncode == 0

        self._wait(answers, timeout, "munged to answer")

    def _wait(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        """wait_until, failing at once if a daemon died; errors carry the logs' tails."""

        def check() -> bool:
            for name, proc in self._daemons:
                if proc.poll() is not None:
                    raise TestbedError(
                        f"{name} exited rc={proc.returncode} while waiting for {what}\n"
                        + self.log_tails()
                    )
            return bool(predicate())

        try:
            wait_until(check, timeout, what, interval=0.05)
        except TestbedError as exc:
            if str(exc).startswith("timed out"):
                raise TestbedError(f"{exc}\n{self.log_tails()}") from None
            raise

    # ---------------------------------------------------------------- using it

    def run_on_login(
        self, argv: list[str], *, timeout: float = 30, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the login host as its user (text; never raises on rc != 0)."""
        return self.login.run(
            argv, as_user=True, check=False, timeout=timeout, input=input, text=True
        )

    def node_states(self) -> dict[str, str]:
        """node name -> sinfo's short state (idle, alloc, mix, comp, down*, drain, ...)."""
        proc = self.run_on_login(["sinfo", "-h", "-N", "-o", "%N %t"])
        return dict(line.split(maxsplit=1) for line in proc.stdout.splitlines() if " " in line)

    def _ctld_up(self) -> bool:
        ping = self.run_on_login(["scontrol", "ping"])
        return ping.returncode == 0 and " is UP" in ping.stdout

    def all_idle(self) -> bool:
        states = self.node_states()
        return all(states.get(n) == "idle" for n in self.node_names)

    def squeue_ids(self) -> list[str]:
        """Ids of every job in the queue (pending, running, completing), of any user."""
        proc = self.login.run(["squeue", "-h", "-o", "%i"], check=False, text=True)
        if proc.returncode != 0:
            raise TestbedError(f"squeue failed: {proc.stderr.strip()}")
        return proc.stdout.split()

    def job_pids(self) -> list[int]:
        """Live processes of the login user on the compute hosts (jobs' tasks)."""
        uid = self.login.uid
        found = []
        for host in self.computes:
            for pid in host.pids():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        found.append(pid)
        return found

    def cancel_all_and_wait(self, timeout: float = 30) -> None:
        """scancel every job (as root); wait until the queue is empty and every node idle."""
        if ids := self.squeue_ids():
            self.login.run(["scancel", *ids], check=False)
        self._wait(lambda: not self.squeue_ids() and self.all_idle(), timeout, "an empty queue")

    def stop_slurmctld(self, timeout: float = 15) -> None:
        """Stop the controller by pid, as an outage or a restart does (it saves its state):
        squeue and sbatch fail, running jobs go on, until start_slurmctld()."""
        for what, proc in self._daemons:
            if what == "slurmctld":
                _terminate(proc, timeout)
        self._daemons = [d for d in self._daemons if d[0] != "slurmctld"]

    def start_slurmctld(self, timeout: float = 30) -> None:
        """The controller again (from its saved state); returns once it answers."""
        self._start(self.login, "slurmctld", [SLURMCTLD, "-D"])
        self._wait(self._ctld_up, timeout, "slurmctld to answer")

    def lose_node(self, host: TestHost) -> None:
        """A compute host gone as a dead machine goes: its slurmd, its jobs' steps and
        tasks killed at once by pid (its sshd, the bed's, stays), and the controller told
        that the node is down, as it decides by itself SlurmdTimeout (300 s) later."""
        what = f"slurmd-{host.hostname}"
        for name, proc in self._daemons:
            if name == what:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self._daemons = [d for d in self._daemons if d[0] != what]
        uid = self.login.uid
        for pid in host.pids():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/exe") in DAEMON_EXES or (
                    os.stat(f"/proc/{pid}").st_uid == uid
                ):
                    os.kill(pid, signal.SIGKILL)
        down = ["scontrol", "update", f"NodeName={host.hostname}", "State=DOWN", "Reason=lost"]
        proc = self.login.run(down, check=False, text=True)
        if proc.returncode != 0:
            raise TestbedError(f"scontrol could not set {host.hostname} down: {proc.stderr}")

    def bring_back(self, host: TestHost, timeout: float = 30) -> None:
        """The host's slurmd again (unless it runs): the node returns to service as it
        registers (ReturnToService=2); returns once sinfo no longer shows it down."""
        what = f"slurmd-{host.hostname}"
        if not any(name == what and proc.poll() is None for name, proc in self._daemons):
            self._start(host, what, [SLURMD, "-D", "-N", host.hostname])
        self._wait(
            lambda: "down" not in self.node_states().get(host.hostname, "down"),
            timeout,
            f"{host.hostname} back in service",
        )

    def ssh_config_text(self, identity: Path | None = None) -> str:
        """Host blocks for the cluster's hosts; aliases are the host names (``login``...)."""
        return "\n".join(h.ssh_config_block(identity=identity) for h in self._hosts)

    def known_hosts_text(self) -> str:
        return "".join(line + "\n" for h in self._hosts for line in h.known_hosts_lines())

    # ---------------------------------------------------------------- closing

    def leftover_pids(self) -> list[int]:
        """munged/slurm processes in the cluster's namespaces (by executable), and the
        login user's processes on the compute hosts."""
        found = set(self.job_pids()) if self._hosts else set()
        for host in self._hosts:
            for pid in host.pids():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/exe") in DAEMON_EXES:
                        found.add(pid)
        return sorted(found)

    def close(self) -> None:
        """scancel every job, stop the daemons by pid, remove the cluster's files.

        After the scancel it waits (up to KillWait and a little) for the queue to empty:
        with a job still ending, slurmctld and slurmd wait on RPCs to each other when
        they get SIGTERM (10 s and more).  Daemons that do not exit within 2 s of their
        SIGTERM are SIGKILLed; then what the slurmds left (steps, their tasks), by pid.
        """
        if self._closed:
            return
        self._closed = True
        alive = {what for what, proc in self._daemons if proc.poll() is None}
        if {"munged", "slurmctld"} <= alive:
            with contextlib.suppress(Exception):
                if ids := self.squeue_ids():
                    self.login.run(["scancel", *ids], check=False, timeout=10)
                    wait_until(lambda: not self.squeue_ids(), 7, "an empty queue", 0.05)
        rank = {"slurmctld": 0, "munged": 2}  # slurmctld first, munged last
        for _, proc in sorted(self._daemons, key=lambda d: rank.get(d[0], 1)):
            _terminate(proc)
        kill_until_gone(self.leftover_pids)
        for name in self._names:
            shutil.rmtree(self._etc_slurm(name), ignore_errors=True)
        shutil.rmtree(self.paths.root, ignore_errors=True)
        shutil.rmtree(self.shared, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 2) -> None:
    """SIGTERM by pid; SIGKILL if it has not exited after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
