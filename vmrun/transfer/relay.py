"""The host-to-host hop: a tree already on host A copied to host B over B's private address,
the bytes going A -> B directly, never through this machine.

vmrun holds SSH connections to both. For one transfer it makes an ed25519 key here; the
private half goes to A through stdin (a 0600 file in a 0700 folder, never on a command line),
the public half into B's authorized_keys as `restrict,from="A",command="relay.sh receive"`,
so it can do nothing but unpack one stream under the destination. A checks B's host key
against the one vmrun verified (a known_hosts of one line, no trust on first use). Only what
B lacks or holds otherwise travels (the two listings compared, checksums for the doubtful),
as an upload's records (A's transfer_pack.py into B's transfer_recv.py): each file hashed
on both ends as it travels and renamed into place on B as soon as it is whole and its
SHA-256 is A's, so a hop cut short keeps every file that arrived, and the next push sends
only the rest. The key line and A's key go in every ending (`finally`); after a SIGKILL of
vmrun, `remove_stale_relay_keys` finds them by their `vmrun-relay-` mark. All host-side
work is vmrun/hostside/relay.sh (python3 on both hosts; without it the host gets the data
from here).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from vmrun import hostside
from vmrun.errors import AuthError, HostKeyError, RemoteError, UnreachableError, UsageError
from vmrun.remote_paths import STATE_DIR
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.transfer.manifest import (
    Entry,
    RootListing,
    join_remote,
    links_inside,
    list_remote,
    remote_arg,
    remote_hashes,
)
from vmrun.transfer.streams import capture
from vmrun.transfer.types import Progress

T = TypeVar("T")
U = TypeVar("U")

STATE = f"{STATE_DIR}/relay"  # per transfer: A's key and known_hosts, B's destination
MARK = "vmrun-relay-"  # every tag and key comment starts so
STALE_S = (
    6 * 3600
)  # a transfer key older than this is a killed push's: the next push's check removes it
CONNECT_TIMEOUT = 5.0  # A's ssh to B: an unreachable private address fails this fast

# what A's ssh says when it never reached B's sshd
_UNREACHED = (
    "connect to host",
    "Connection timed out",
    "Connection refused",
    "No route to host",
    "Network is unreachable",
    "Could not resolve",
    "no ssh client",
)


@dataclass
class RelayReport:
    tag: str  # this transfer's name (key comment, relay folder)
    source: str  # A's label
    dest: str  # B's label
    from_addr: str = ""  # A's address as B sees it (the key's from=), "" if unknown
    sent: list[str] = field(default_factory=list)  # files and links sent, relative
    sent_bytes: int = 0
    unchanged: int = 0  # files B already held
    dirs: int = 0  # directories made on B
    skipped: list[str] = field(default_factory=list)  # "rel: why" (links out of the tree)
    seconds: float = 0.0


def new_tag(now: float | None = None) -> str:
    """`vmrun-relay-<unix time>-<8 hex>`: unique, and dated for the stale sweep."""
    return f"{MARK}{int(time.time() if now is None else now)}-{secrets.token_hex(4)}"


def transfer_key() -> tuple[bytes, str]:
    """A fresh ed25519 pair: the private half in OpenSSH's format (for A's ssh -i, sent
    through stdin only) and the public "ssh-ed25519 base64" (for B's authorized_keys)."""
    from vmrun.ssh.hostkeys import new_ed25519

    private, public = new_ed25519()
    return private.encode("ascii"), public


def receive_command(tag: str) -> str:
    """The forced command of the transfer's key line (run by B's login shell in the home),
    counted as vmrun's work while it runs (autostop leaves a receiving host up)."""
    return quoting.plain_command(hostside.command("relay.sh", "receive", STATE, tag))


def authorized_line(public_key: str, tag: str, from_addr: str | None) -> str:
    """The authorized_keys line for `public_key` ("type base64 ..."): no pty, forwarding or
    agent (`restrict`), only from `from_addr` where known, only the receiver."""
    command = receive_command(tag)
    if any(c in command for c in "\n\r") or command.endswith("\\"):
        raise ValueError("the receive command cannot go into an authorized_keys option")
    options = ["restrict"]
    if from_addr:
        options.append(f'from="{ipaddress.ip_address(from_addr)}"')
    options.append('command="' + command.replace('"', '\\"') + '"')
    kind, blob = public_key.split()[:2]
    return f"{','.join(options)} {kind} {blob} {tag}"


def known_hosts_line(addr: str, port: int, host_key: str) -> str:
    """A's known_hosts for B: `host_key` is "type base64" as vmrun verified it."""
    words = host_key.split()
    if len(words) < 2 or any(c in addr for c in " \t\n,[]"):
        raise UsageError(f"cannot pin the host key of {addr!r}: {host_key!r}")
    name = addr if port == 22 else f"[{addr}]:{port}"
    return f"{name} {words[0]} {words[1]}"


def _relay_sh(
    conn: Connection, action: str, tag: str, *args: str, stdin: bytes = b"", what: str
) -> bytes:
    """Run one relay.sh action on the host; its stdout, or a RemoteError naming `what`."""
    argv = hostside.command("relay.sh", action, STATE, tag, *args)
    status, out, err = capture(conn, quoting.plain_command(argv), stdin=stdin, what=what)
    if status != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit status {status}"
        raise RemoteError(f"{what} failed: {last}", host=conn.label, code="transfer-failed")
    return out


def _nul(words: list[str]) -> bytes:
    return b"".join(os.fsencode(w) + b"\0" for w in words)


def remove_stale_relay_keys(conn: Connection, *, older_than: float = 0) -> int:
    """Remove every transfer key line (`vmrun-relay-` comment) from the host's
    authorized_keys, every relay folder (a key, a known_hosts) and an older vmrun's staging
    folder, at least `older_than` seconds old: what a vmrun killed mid-transfer left. How
    many went."""
    out = _relay_sh(conn, "revoke", "", str(int(older_than)), what="removing stale transfer keys")
    words = out.decode("ascii", "replace").split()
    return int(words[-1]) if words and words[-1].isdigit() else 0


@dataclass
class _Plan:
    files: list[Entry]
    links: list[Entry]
    dirs: list[str]


def _root(listing: RootListing, conn: Connection, path: str, *, must_exist: bool) -> list[Entry]:
    if listing.state == "missing" and not must_exist:
        return []
    if listing.state != "ok":
        raise RemoteError(
            f"{path} is not on the host ({listing.state})",
            host=conn.label,
            code="remote-path-not-found",
        )
    if any(e.rel == "" and e.kind != "d" for e in listing.entries):
        raise UsageError(f"{path} on the host is not a directory", host=conn.label)
    return listing.entries


def _plan(
    src: Connection,
    dst: Connection,
    src_dir: str,
    dst_dir: str,
    report: RelayReport,
    verify: bool,
) -> _Plan:
    """What B lacks or holds otherwise: size first, then mtime, then checksums."""
    listed = _at_once(lambda: list_remote(src, [src_dir]), lambda: list_remote(dst, [dst_dir]))
    ours = _root(listed[0].roots[0], src, src_dir, must_exist=True)
    theirs = {e.rel: e for e in _root(listed[1].roots[0], dst, dst_dir, must_exist=False)}
    inside = links_inside({e.rel: e.link for e in ours if e.kind == "l"})
    plan = _Plan([], [], [])
    doubtful: list[Entry] = []
    for e in ours:
        there = theirs.get(e.rel)
        if e.kind == "d" and e.rel:
            if there is None or there.kind != "d":
                plan.dirs.append(e.rel)
        elif e.kind == "l":
            if e.rel not in inside:
                report.skipped.append(f"{e.rel}: a symlink that leads out of the tree")
            elif there is None or there.kind != "l" or there.link != e.link:
                plan.links.append(e)
        elif e.kind == "f":
            _file(e, there, plan, doubtful, report, verify)
    if doubtful:
        a, b = _both_hashes(
            src,
            [join_remote(src_dir, e.rel) for e in doubtful],
            dst,
            [join_remote(dst_dir, e.rel) for e in doubtful],
        )
        for e in doubtful:
            mine = a.get(join_remote(src_dir, e.rel))
            if mine is not None and mine == b.get(join_remote(dst_dir, e.rel)):
                report.unchanged += 1
            else:
                plan.files.append(e)
    return plan


def _file(
    e: Entry,
    there: Entry | None,
    plan: _Plan,
    doubtful: list[Entry],
    report: RelayReport,
    verify: bool,
) -> None:
    if there is None or there.kind != "f" or there.size != e.size:
        plan.files.append(e)
    elif there.mtime_ns == e.mtime_ns and not verify:
        report.unchanged += 1
    else:
        doubtful.append(e)


def _at_once(first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
    """Two round trips (one on each host, or two on one) at the same time; the first
    error of either is raised once both have ended."""
    found: list[T] = []
    failed: list[BaseException] = []

    def run_first() -> None:
        try:
            found.append(first())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run_first, daemon=True)
    thread.start()
    try:
        other = second()
    finally:
        thread.join()
    if failed:
        raise failed[0]
    return found[0], other


def _both_hashes(
    src: Connection, src_paths: list[str], dst: Connection, dst_paths: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """SHA-256 on both hosts at once (each hashes its own disk)."""
    return _at_once(lambda: remote_hashes(src, src_paths), lambda: remote_hashes(dst, dst_paths))


def _send(
    src: Connection,
    argv: list[str],
    dst: Connection,
    dst_addr: str,
    files: int,
    total: int,
    progress: Progress,
) -> None:
    """Run the sender on A; its tar's checkpoint lines become `progress` (host: B's label)."""
    progress.begin(dst.label, files, total, via=src.label)
    said: list[str] = []
    sent = 0

    def on_output(stream: str, data: bytes) -> None:
        nonlocal sent
        line = data.decode("utf-8", "replace").strip()
        words = line.split()
        if stream == "err" and len(words) == 3 and words[1] == "vmrun-relay-sent":
            now = min(total, int(words[2])) if words[2].isdigit() else sent
            if now > sent:
                progress.advance(dst.label, now - sent)
                sent = now
        elif line:
            said.append(line)

    result = src.run(argv, what=f"sending to {dst.label}", on_output=on_output)
    if result.exit_status != 0:
        raise _send_error(result.exit_status, "\n".join(said[-20:]), src, dst.label, dst_addr)
    if total > sent:
        progress.advance(dst.label, total - sent)


def _send_error(status: int, err: str, src: Connection, dst_label: str, addr: str) -> Exception:
    """What A's `relay.sh send` exit says: B unreachable, refused, or the stream failed."""
    last = err.strip().splitlines()[-1] if err.strip() else f"exit status {status}"
    where = f"{dst_label} at {addr}"
    if status == 126:  # relay.sh: no python3 on one of the two
        return UnreachableError(
            f"no host-to-host hop from {src.label} to {where}: {last}",
            host=src.label,
            hint="the data can go from here to that host instead",
            code="relay-unreachable",
        )
    if status in (255, 127):
        if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION" in err:
            return HostKeyError(
                f"{src.label} refused the host key of {where}: {last}", host=src.label
            )
        if "Permission denied" in err:
            return AuthError(
                f"{where} refused the transfer key from {src.label}: {last}", host=src.label
            )
        if status == 127 or any(s in err for s in _UNREACHED):
            return UnreachableError(
                f"{src.label} cannot reach {where} over SSH: {last}",
                host=src.label,
                hint="the data can go from here to that host instead",
                code="relay-unreachable",
            )
    what = "reading the files" if status == 3 else "the stream"
    return RemoteError(
        f"sending from {src.label} to {where} failed ({what}): {last}",
        host=src.label,
        hint="check free space and permissions of the destination on both hosts",
        code="transfer-failed",
    )


def relay(
    src: Connection,
    dst: Connection,
    dst_addr: str,
    src_dir: str,
    dst_dir: str,
    *,
    dst_host_key: str,
    out: Reporter = QUIET,
    progress: Progress | None = None,
    dst_port: int = 22,
    src_addr: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    verify: bool = False,
) -> RelayReport:
    """Make `dst_dir` on dst hold the tree `src_dir` on src (both normalised remote paths,
    relative to the home or absolute), the bytes going from src to `dst_addr`:`dst_port`.

    `dst_host_key`: dst's "type base64" as vmrun verified it; `src_addr`: src's address as
    dst sees it (the key's from=; found with `ip route get` on src when None, left out if
    that fails); `progress`: begin/advance under dst's label (bytes as src's tar reads
    them, every 8 MiB); `verify`: checksums for files whose size and mtime agree too. Raises
    UnreachableError code `relay-unreachable` within about `connect_timeout` when src
    cannot open SSH to `dst_addr`; nothing is left on either host in any ending."""
    started = time.monotonic()
    progress = progress or Progress()
    tag = new_tag()
    report = RelayReport(tag=tag, source=src.label, dest=dst.label)
    known = known_hosts_line(dst_addr, dst_port, dst_host_key)
    plan = _plan(src, dst, src_dir, dst_dir, report, verify)
    items = [*plan.files, *plan.links]
    if not items:
        _make_dirs(dst, tag, dst_dir, plan, report)
        report.seconds = time.monotonic() - started
        return report
    total = sum(e.size for e in plan.files)
    out.info(
        f"{src.label} -> {dst.label} ({dst_addr}): {len(items)} files, {total / 2**20:.1f} MiB"
    )
    private, public = transfer_key()
    try:
        found = _place_key(
            src, dst, tag, known, dst_addr, dst_dir, private, public, src_addr, items
        )
        try:
            report.from_addr = str(ipaddress.ip_address(found)) if found else ""
        except ValueError:
            report.from_addr = ""
        user = dst.target.user if dst.target is not None else dst.spec.user
        argv = hostside.command(
            "relay.sh",
            "send",
            STATE,
            tag,
            src_dir,
            str(user),
            dst_addr,
            str(dst_port),
            str(max(1, round(connect_timeout))),
        )
        _send(src, argv, dst, dst_addr, len(items), total, progress)
        _check_placed(src, dst, tag, items)
        _make_dirs(dst, tag, dst_dir, plan, report)
        report.sent = [e.rel for e in items]
        report.sent_bytes = total
    finally:
        _cleanup(src, dst, tag, out)
    report.seconds = time.monotonic() - started
    return report


def _place_key(
    src: Connection,
    dst: Connection,
    tag: str,
    known: str,
    dst_addr: str,
    dst_dir: str,
    private: bytes,
    public: str,
    src_addr: str | None,
    items: list[Entry],
) -> str:
    """The key and the list of what to send on A, the key's line on B (at once when A's
    address is known beforehand: the line's from= needs it). A's address, as found."""

    def on_src() -> str:
        said = _relay_sh(
            src, "key", tag, known, dst_addr, stdin=private, what="placing the transfer key"
        )
        _relay_sh(
            src, "list", tag, stdin=_nul([e.rel for e in items]), what="listing the files to send"
        )
        return src_addr or said.decode("ascii", "replace").strip()

    def on_dst(addr: str | None) -> None:
        try:
            line = authorized_line(public, tag, str(ipaddress.ip_address(addr)) if addr else None)
        except ValueError:
            line = authorized_line(public, tag, None)
        _relay_sh(
            dst,
            "grant",
            tag,
            stdin=line.encode() + b"\n" + os.fsencode(dst_dir),
            what="allowing the transfer key",
        )

    if src_addr:
        found, _ = _at_once(on_src, lambda: on_dst(src_addr))
        return found
    found = on_src()
    on_dst(found or None)
    return found


def _make_dirs(dst: Connection, tag: str, dst_dir: str, plan: _Plan, report: RelayReport) -> None:
    """The directories B lacks (the empty ones too), before anything is renamed into them."""
    if plan.dirs:
        _relay_sh(
            dst,
            "mkdirs",
            tag,
            dst_dir,
            stdin=_nul([remote_arg(d) for d in plan.dirs]),
            what="making directories",
        )
        report.dirs = len(plan.dirs)


def _check_placed(src: Connection, dst: Connection, tag: str, items: list[Entry]) -> None:
    """What the receiver said of each file and link: placed (its SHA-256 was A's), or not."""
    from vmrun.transfer.records import Lane, parse_results

    said = Lane()
    parse_results(_relay_sh(src, "results", tag, what="reading what arrived"), said)
    bad = [e.rel for e in items if said.results.get(os.fsencode(e.rel)) != ""]
    if bad:
        why = said.results.get(os.fsencode(bad[0])) or "not received"
        raise RemoteError(
            f"{len(bad)} files did not arrive intact from {src.label} (first: {bad[0]!r}: {why})",
            host=dst.label,
            hint="a file that changed on the source while it was sent differs too; the"
            " next push sends only what is missing",
            code="transfer-failed",
        )


def _cleanup(src: Connection, dst: Connection, tag: str, out: Reporter) -> None:
    """B's key line and A's key, at once: each tried whatever the other did."""

    def revoke(conn: Connection) -> None:
        try:
            _relay_sh(conn, "revoke", tag, "0", what="removing the transfer key")
        except Exception as exc:
            out.warn(
                f"{conn.label}: could not remove transfer key {tag} ({exc}); the next push or"
                " `vmrun doctor` removes it"
            )

    _at_once(lambda: revoke(dst), lambda: revoke(src))
