"""The push's checks, quick: the host script's verdicts (run here, with a fake `df` on PATH
for a full disk), the sources refused before connecting, what a push would send."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vmrun import hostside
from vmrun.errors import UsageError
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
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
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
