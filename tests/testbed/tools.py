"""The system tools the bed drives (absolute paths) and how it runs them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Sequence

from .errors import TestbedError

STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


def _which(name: str, fallback: str) -> str:
    return shutil.which(name, path=STD_PATH) or fallback


IP = _which("ip", "/usr/sbin/ip")
NFT = _which("nft", "/usr/sbin/nft")
UNSHARE = _which("unshare", "/usr/bin/unshare")
SETPRIV = _which("setpriv", "/usr/bin/setpriv")
HOSTNAME = _which("hostname", "/usr/bin/hostname")
SSH_KEYGEN = _which("ssh-keygen", "/usr/bin/ssh-keygen")
USERADD = _which("useradd", "/usr/sbin/useradd")
USERDEL = _which("userdel", "/usr/sbin/userdel")
MOUNT = _which("mount", "/usr/bin/mount")
SSHD = "/usr/sbin/sshd"  # sshd insists on an absolute path (it re-execs itself)
SFTP_SERVER = "/usr/lib/openssh/sftp-server"

NETNS_TOOLS = (IP, NFT, UNSHARE, SETPRIV, HOSTNAME, SSH_KEYGEN, USERADD, USERDEL, SSHD)


def run_cmd(
    argv: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """Run a bed-internal command; failures carry stderr so they can be diagnosed."""
    env = {"PATH": STD_PATH, "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run(
            list(argv), input=input, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"timed out after {timeout}s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        raise TestbedError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n"
            f"{proc.stderr.strip()}\n{proc.stdout.strip()}".rstrip()
        )
    return proc


def ip_batch(lines: Iterable[str], *, netns: str | None = None, force: bool = False) -> None:
    """Run many ``ip`` commands in one process: one exec instead of dozens keeps beds fast."""
    text = "\n".join(lines)
    if not text:
        return
    argv = [IP]
    if netns:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    argv += ["-batch", "-"]
    run_cmd(argv, input=text + "\n", check=not force)
