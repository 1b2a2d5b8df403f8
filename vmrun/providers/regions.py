"""Which regions `vmrun up` has used, per provider: where `vmrun cloud` looks.

A cluster made in a region nobody remembers bills unseen, so `vmrun up` notes its region
before it creates anything, and the note outlives any vmrun.toml (it is the user's, in
`$XDG_CONFIG_HOME/vmrun/regions.json`). An unreadable record is an error, never "no regions":
reading it as empty would hide exactly what it is for.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vmrun.config import _user_config_dir
from vmrun.errors import ConfigError

FILE_NAME = "regions.json"


def regions_path(environ: Mapping[str, str] | None = None) -> Path:
    return _user_config_dir(environ) / FILE_NAME


def regions_used(provider: str, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """The regions noted for `provider`, sorted; [] before the first `vmrun up`."""
    return sorted(_read(regions_path(environ)).get(provider, []))


def note_region(provider: str, region: str, *, environ: Mapping[str, str] | None = None) -> None:
    """Add `region` to the record (a no-op when it is there), atomically and user-only:
    two `vmrun up` at once both land (a lock around the read and the write)."""
    if not region:
        raise ValueError("note_region needs a region")
    path = regions_path(environ)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _locked(path):
        data = _read(path)
        known = data.get(provider, [])
        if region in known:
            return
        data[provider] = sorted({*known, region})
        _write(path, data)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read(path: Path) -> dict[str, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise _broken(path, getattr(exc, "strerror", None) or str(exc)) from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _broken(path, f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(r, str) for r in v) for v in data.values()
    ):
        raise _broken(path, 'not {"PROVIDER": ["REGION", ...]}')
    return data


def _broken(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path}: the record of the regions vmrun used cannot be read ({why})",
        hint=f'fix it, or write {{"aws": ["us-east-1"]}} with every region you used into {path}',
        code="bad-config",
    )


def _write(path: Path, data: Mapping[str, list[str]]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
