"""What a run asks of containers, and where each part comes from.

`--image`, `--mount` and `--pull` on the command line; `image`, `mounts`, `pull`,
`container_runtime` and `container_ulimits` in the user config, vmrun.toml, `VMRUN_*`, and in
a host's (or a cluster's) own table, which wins over the project's for that host. `--image`
wins over every table; `--mount`s are added to the table's mounts (a later one with the same
destination replaces an earlier one). A run records what it resolved to (`meta`), so
`--resume` and `status` use what it ran with, not what the files say today.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vmrun.containers.image import Image, Mount, parse_image, parse_mount
from vmrun.errors import UsageError

_ULIMIT = re.compile(r"[a-z]+=-?[0-9]+(?::-?[0-9]+)?")
# When an image is pulled (hostside/container_pull.sh), as Docker's and Podman's --pull:
# `newer` (the default) the registry's when it answers, else the host's own copy; `missing`
# only when the host has none; `always`; `never` (the host's own, or the run is refused).
PULL_POLICIES = ("newer", "missing", "always", "never")


@dataclass(frozen=True)
class Request:
    """One node's container: the image, its mounts, the runtime by name (`auto`: docker,
    else podman) and its limits (empty: NGC's)."""

    image: Image
    mounts: tuple[Mount, ...] = ()
    runtime: str = "auto"
    ulimits: tuple[str, ...] = ()
    pull: str = "newer"  # PULL_POLICIES

    def meta(self) -> dict[str, Any]:
        """What run.json keeps of it (vmrun.results.record's `Image`, which makes it again)."""
        return {
            "image": str(self.image),
            "mounts": [str(m) for m in self.mounts],
            "container_runtime": self.runtime,
            "container_ulimits": list(self.ulimits),
            "pull": self.pull,
        }


def check_pull(value: str) -> str:
    """A pull policy (PULL_POLICIES), or `bad-pull`, exit 2."""
    word = value.strip().lower()
    if word not in PULL_POLICIES:
        raise UsageError(f"pull {value!r}: not one of {', '.join(PULL_POLICIES)}", code="bad-pull")
    return word


def check_ulimits(values: Sequence[str]) -> tuple[str, ...]:
    for value in values:
        if not _ULIMIT.fullmatch(value):
            raise UsageError(
                f"container_ulimits {value!r}: expected NAME=SOFT[:HARD] (e.g. memlock=-1,"
                " stack=67108864)",
                code="bad-ulimit",
            )
    return tuple(values)


@dataclass(frozen=True)
class Asked:
    """The container settings as given: `image` and `mount_flags` from the command line
    (empty: none given), `defaults` the resolved settings (image, mounts,
    container_runtime, container_ulimits) of the config files and the environment."""

    image: str = ""
    mount_flags: tuple[str, ...] = ()
    defaults: Mapping[str, Any] | None = None
    pull: str = ""  # --pull (empty: the tables' or the default)
    # a resumed run's (`fixed`): what it ran with, image or none, whatever the tables say now
    recorded: Request | None = None
    fixed: bool = False

    def check(self) -> None:
        """Every value given so far parsed (bad-image, bad-mount, bad-ulimit: exit 2). A
        --mount without any image is refused where it is resolved: a host's or cluster's
        own table may give the image."""
        merged = dict(self.defaults or {})
        text = self.image or str(merged.get("image") or "")
        if text:
            parse_image(text)
        for mount in [*map(str, merged.get("mounts") or []), *self.mount_flags]:
            parse_mount(mount)
        check_ulimits([str(u) for u in merged.get("container_ulimits") or []])
        check_pull(self.pull or str(merged.get("pull") or "newer"))

    def resolve(self, table: Mapping[str, Any]) -> Request | None:
        """The request for a host or cluster whose own table is `table`; None: no image."""
        if self.fixed:
            return self.recorded
        merged = {**(self.defaults or {}), **{k: v for k, v in table.items() if v is not None}}
        text = self.image or str(merged.get("image") or "")
        mounts = [*map(str, merged.get("mounts") or []), *self.mount_flags]
        if not text:
            if self.mount_flags:
                raise UsageError(
                    "--mount is for a run inside an image; give --image too (or image ="
                    ' "..." in vmrun.toml)',
                    code="bad-mount",
                )
            return None
        by_target = {m.target: m for m in map(parse_mount, mounts)}
        return Request(
            parse_image(text),
            tuple(by_target.values()),
            str(merged.get("container_runtime") or "auto"),
            check_ulimits([str(u) for u in merged.get("container_ulimits") or []]),
            check_pull(self.pull or str(merged.get("pull") or "newer")),
        )


def asked_from(
    image: str | None, mounts: Sequence[str] | None, settings: Any, pull: str | None = None
) -> Asked:
    """The Asked of a command line over `settings` (vmrun.config.Settings)."""
    defaults = {
        "image": settings.image,
        "mounts": settings.mounts,
        "container_runtime": settings.container_runtime,
        "container_ulimits": settings.container_ulimits,
        "pull": settings.pull,
    }
    return Asked(image or "", tuple(mounts or ()), defaults, pull=pull or "")


TABLE_KEYS = ("image", "mounts", "pull", "container_runtime", "container_ulimits")


def table_of(variables: Mapping[str, Any]) -> dict[str, Any]:
    """A host's or cluster's own container keys."""
    return {k: variables[k] for k in TABLE_KEYS if k in variables}
