"""The push's checks, quick: the host script's verdicts (run here, with a fake `df` on PATH
for a full disk), the sources refused before connecting, what a push would send."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vmrun import hostside
from vmrun.errors import UsageError, VmrunError
from vmrun.operations import push
from vmrun.transfer import push as transfer_push
from vmrun.transfer.manifest import Entry
from vmrun.transfer.upload import scan


def _check(tmp_path: Path, target: str, needed_kib: int, free_kib: int | None = None) -> str:
    env = {**os.environ, "HOME": str(tmp_path)}
    if free_kib is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        fake = bin_dir / "df"
        fake.write_text(
            "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
            f"echo 'fake 100000 0 {free_kib} 0% /'\n"
        )
        fake.chmod(0o755)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = subprocess.run(
        ["sh", "-c", hostside.source(transfer_push.CHECK), "push_check", target, str(needed_kib)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_check_makes_the_folder_and_weighs_the_free_space(tmp_path: Path) -> None:
    assert _check(tmp_path, "a/b", 10, free_kib=500) == "ok 500"
    assert (tmp_path / "a" / "b").is_dir()
    assert _check(tmp_path, "a/b", 1000, free_kib=500) == "nospace 500"
    (tmp_path / "file").write_text("x")
    assert _check(tmp_path, "file/below", 1) == "nowrite"


def test_sources_are_checked_before_any_connection(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        push.check_sources([tmp_path / "nosuch"])
    assert err.value.code == "source-not-found"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "a").mkdir()
    with pytest.raises(UsageError) as err:
        push.check_sources([tmp_path / "a", tmp_path / "b" / "a"])
    assert err.value.code == "flags-conflict"


def test_only_files_differing_by_size_or_mtime_would_be_sent(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "same").write_bytes(b"12345")
    (root / "sub" / "new").write_bytes(b"123")
    (root / "link").symlink_to("/etc/hostname")
    st = (root / "same").stat()
    there = [Entry("same", "f", 5, st.st_mtime_ns, 0o644), Entry("gone", "f", 1, 0, 0o644)]
    plan = transfer_push._plan(root, "x/data", there, scan(root))
    assert (plan.files, plan.to_send, plan.bytes_to_send) == (2, 1, 3)


def test_the_check_removes_a_transfer_key_a_killed_push_left(tmp_path: Path) -> None:
    from vmrun.transfer.relay import STALE_S, STATE, authorized_line, new_tag

    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ7c2Y0d0yJYwqzCUR4wA1y8vUxHv7iYH3VvS4L7bN1 x"
    old, young = new_tag(now=1_000_000), new_tag()
    (ssh / "authorized_keys").write_text(
        "ssh-ed25519 AAAAmine me\n"
        + "".join(authorized_line(pub, t, None) + "\n" for t in (old, young))
    )
    script = str(hostside.HERE / transfer_push.CHECK)  # beside relay.sh, as on a host
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run(
        ["sh", script, "d", "1", STATE, str(STALE_S)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split()[0] == "ok"
    keys = (ssh / "authorized_keys").read_text()
    assert old not in keys and young in keys and "AAAAmine me" in keys


def test_what_must_travel_is_compared_with_the_free_space_before_a_byte_is_sent() -> None:
    """The folder's check runs beside the listing (free KiB); what the listing says must
    travel is compared here: more than fits is `no-space-left`, naming both sizes."""

    class Conn:
        label = "h1"

    transfer_push._room(Conn(), "data", 10 * 1024, 10 * 1024 * 1024)  # type: ignore[arg-type]
    transfer_push._room(Conn(), "data", None, 1 << 40)  # type: ignore[arg-type]  # not known
    with pytest.raises(VmrunError) as full:
        transfer_push._room(Conn(), "data", 10 * 1024, 11 * 1024 * 1024)  # type: ignore[arg-type]
    assert full.value.code == "no-space-left" and "10 MiB free" in full.value.message
