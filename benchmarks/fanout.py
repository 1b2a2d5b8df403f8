"""One command on many hosts: `vmrun exec -- true` against `pdsh -R ssh` and `parallel-ssh`.

Goals (the 64-host fan-out issue): 64 hosts in <= 0.5x the time of pdsh and parallel-ssh;
256 hosts in <= 3 s; 32 hosts behind one bastion whose sshd keeps OpenSSH's default
MaxStartups (10:30:100): every host reached, in <= 2x the direct time. Also the vmrun
process's peak memory, and what each host adds to it.

Runs the real CLI against netns test hosts (root only; see tests/testbed), every tool with
the same ssh config, keys and known_hosts; each host has its own sshd, home and address
(hosts share one login user, so the bed is quick to build: about 40 ms a host). pdsh and
parallel-ssh run with their default fan-out (32) and again with one as wide as vmrun's.

    sudo python benchmarks/fanout.py [--hosts 64 --hosts 256] [--bastion 32] [--rounds 3]

Measured here (2 shared cores; medians of 3; `exec -- true`, vmrun / pdsh): 32 hosts 0.77 s
/ 1.76 s (0.44x); 64 hosts 1.50 s / 3.50 s (0.42x, parallel-ssh 3.53 s); 256 hosts 5.73 s /
14.05 s (0.41x; goal 3 s missed: the 256 sshds share the two cores, 10.5 s of CPU in all);
first time (installing vmrun's host-side files) 1.62 s, 3.37 s, 12.53 s; 32 hosts behind a
bastion with MaxStartups 10:30:100: all reached in 0.98 s (1.27x direct). Peak memory 38 MiB
for one host, 66 MiB for 256 (105-164 KiB a host).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402

PER_BED = 200  # hosts in one bed (its "main" /24)


def _timed(
    argv: list[str], env: dict[str, str], cwd: Path, *, check: bool = True
) -> tuple[float, int, str]:
    """Seconds, the child's peak RSS in KiB (wait4's ru_maxrss), and its output; a failure
    ends the benchmark unless `check` is off."""
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - began
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code != 0 and check:
        tail = "\n".join(out.splitlines()[-6:])
        sys.exit(f"{argv[0]} failed ({code}):\n{tail}")
    return took, usage.ru_maxrss, out


class Fleet:
    """N hosts in as many beds as they need, and a user's side that reaches all of them."""

    def __init__(self, tmp: Path, keys: ClientKeys, count: int, *, bastion: bool = False):
        self.stack = contextlib.ExitStack()
        self.names: list[str] = []
        config, known = [], []
        self.home, self.cwd = tmp / "home", tmp / "project"
        known_file = self.home / ".ssh" / "known_hosts"
        for start in range(0, count, PER_BED):
            bed = self.stack.enter_context(NetnsBed(tmp / f"bed{start}", keys))
            nets: tuple[str, ...] = ("main",)
            if bastion:
                default = "MaxStartups 10:30:100\n"  # OpenSSH's, not the bed's 100
                bed.add_host("bastion", networks=("main", "inner"), sshd_extra_config=default)
                nets = ("inner",)
            for i in range(start, min(count, start + PER_BED)):
                bed.add_host(f"h{i}", networks=nets, login_user="u")
                self.names.append(f"h{i}")
            config.append(bed.ssh_config_text(identity=keys.private, known_hosts=known_file))
            known.append(bed.known_hosts_text())
        (self.home / ".ssh").mkdir(parents=True, mode=0o700)
        self.cwd.mkdir()
        (self.home / ".ssh" / "config").write_text("\n".join(config))
        (self.home / ".ssh" / "known_hosts").write_text("".join(known))
        (self.cwd / "hosts.txt").write_text("".join(n + "\n" for n in self.names))
        toml = "".join(f'[[hosts]]\naddress = "{n}"\ngroups = ["all"]\n' for n in self.names)
        (self.cwd / "vmrun.toml").write_text(toml)
        self.env = {
            "HOME": str(self.home),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT),
            "LANG": "C.UTF-8",
            # OpenSSH reads the passwd entry's ~/.ssh, not $HOME's: name the config
            "PDSH_SSH_ARGS": f"-F {self.home}/.ssh/config -x %h",
        }

    def close(self) -> None:
        self.stack.close()

    def vmrun(self, parallel: int | None = None) -> list[str]:
        argv = [sys.executable, "-m", "vmrun", "exec", "-H", "@all"]
        if parallel:
            argv += ["--parallel", str(parallel)]
        return [*argv, "--", "true"]

    def pdsh(self, fanout: int | None = None) -> list[str]:
        width = ["-f", str(fanout)] if fanout else []
        return ["pdsh", "-S", "-R", "ssh", *width, "-w", "^hosts.txt", "true"]

    def pssh(self, par: int | None = None) -> list[str]:
        width = ["-p", str(par)] if par else []
        config = ["-x", f"-F {self.home}/.ssh/config"]
        return ["parallel-ssh", *width, *config, "-h", "hosts.txt", "-t", "60", "true"]


def _median(fleet: Fleet, argv: list[str], rounds: int) -> float:
    return statistics.median(_timed(argv, fleet.env, fleet.cwd)[0] for _ in range(rounds))


def _report(fleet: Fleet, rounds: int) -> float:
    n = len(fleet.names)
    cold, _, said = _timed(fleet.vmrun(), fleet.env, fleet.cwd, check=False)
    missed = re.search(r"(\d+) of \d+ hosts failed", said)
    _timed(fleet.vmrun(), fleet.env, fleet.cwd)  # the rest of the first time, if any
    mine = _median(fleet, fleet.vmrun(), rounds)
    late = f"; {missed.group(1)} hosts past the connect deadline" if missed else ""
    print(
        f"{n} hosts: vmrun exec -- true   {mine:6.2f} s"
        f"   (first time: {cold:.2f} s, installing vmrun's host-side files{late})"
    )
    for name, argv in (
        ("pdsh -R ssh (fan-out 32)", fleet.pdsh()),
        (f"pdsh -R ssh -f {n}", fleet.pdsh(n)),
        ("parallel-ssh (-p 32)", fleet.pssh()),
        (f"parallel-ssh -p {n}", fleet.pssh(n)),
    ):
        if shutil.which(argv[0]) is None:
            print(f"{n} hosts: {name}: not installed (apt-get install pdsh pssh)")
            continue
        theirs = _median(fleet, argv, rounds)
        print(f"{n} hosts: {name:28s} {theirs:6.2f} s   vmrun: {mine / theirs:.2f}x")
    return mine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, action="append")
    parser.add_argument("--bastion", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = skip_reason_no_netns()
    if reason:
        sys.exit(f"needs the netns test bed: {reason}")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        keys = ClientKeys.generate(tmp / "keys")
        direct: dict[int, float] = {}
        for count in args.hosts or [64, 256]:
            fleet = Fleet(tmp / f"direct{count}", keys, count)
            try:
                direct[count] = _report(fleet, args.rounds)
                one = [sys.executable, "-m", "vmrun", "exec", "-H", fleet.names[0], "--", "true"]
                rss_one = _timed(one, fleet.env, fleet.cwd)[1]
                rss_all = _timed(fleet.vmrun(), fleet.env, fleet.cwd)[1]
                per = (rss_all - rss_one) / max(1, count - 1)
                print(
                    f"{count} hosts: vmrun peak RSS {rss_all / 1024:.0f} MiB"
                    f" (1 host: {rss_one / 1024:.0f} MiB; {per:.0f} KiB a host)"
                )
            finally:
                fleet.close()
        if args.bastion:
            fleet = Fleet(tmp / "bastion", keys, args.bastion, bastion=True)
            try:
                _timed(fleet.vmrun(), fleet.env, fleet.cwd)  # first time: host-side files
                took = _median(fleet, fleet.vmrun(), args.rounds)
                plain = direct.get(args.bastion)
                ratio = f"   {took / plain:.2f}x direct" if plain else ""
                print(
                    f"{args.bastion} hosts behind one bastion (MaxStartups 10:30:100):"
                    f" all reached, {took:.2f} s{ratio}"
                )
            finally:
                fleet.close()


if __name__ == "__main__":
    main()
