"""An image as the user names it (`--image`, `image = "..."`), and the paths mounted into it.

A registry reference is checked against the grammar Docker itself uses
(distribution/reference: `[REGISTRY[:PORT]/]PATH[:TAG][@DIGEST]`), here and before anything
starts, so a typo is one line naming the part that is wrong instead of a pull failing on
every host. Apptainer also runs a `.sif` file, named by its path.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import TypeAlias

from vmrun.errors import UsageError

EXAMPLE = "nvcr.io/nvidia/pytorch:24.05-py3"
DEFAULT_REGISTRY = "docker.io"  # what Docker assumes when the first component is no domain

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = re.compile(rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*")
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = re.compile(
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_NAME_MAX = 255  # Docker's limit on REGISTRY/PATH


def _bad(text: str, what: str) -> UsageError:
    return UsageError(
        f"--image {text!r}: {what}",
        hint=f"give REGISTRY/PATH:TAG (e.g. {EXAMPLE}) or the path of a .sif file",
        code="bad-image",
    )


@dataclass(frozen=True)
class ImageRef:
    """A registry image: `registry` as written (None: Docker Hub), `path`, `tag`, `digest`."""

    registry: str | None
    path: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        text = f"{self.registry}/{self.path}" if self.registry else self.path
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def domain(self) -> str:
        return self.registry or DEFAULT_REGISTRY

    @property
    def repository(self) -> str:
        """The path as the registry knows it (Docker Hub's official images are `library/`)."""
        if self.registry is None and "/" not in self.path:
            return f"library/{self.path}"
        return self.path

    @property
    def pinned(self) -> bool:
        """A digest names one image for ever; a tag may move between pulls."""
        return self.digest is not None

    def docker_uri(self) -> str:
        """apptainer's and singularity's form: `docker://REF`."""
        return f"docker://{self}"

    def enroot(self) -> str:
        """pyxis' (enroot's) form: `REGISTRY#PATH[:TAG][@DIGEST]`; no `#` for Docker Hub."""
        text = f"{self.registry}#{self.path}" if self.registry else self.path
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


@dataclass(frozen=True)
class SifImage:
    """An Apptainer image file; a relative path is the work directory's on the host."""

    path: str

    def __str__(self) -> str:
        return self.path


Image: TypeAlias = ImageRef | SifImage


def parse_image(text: str) -> Image:
    """Check and split an image as the user wrote it; a UsageError (`bad-image`) naming the
    part that is wrong otherwise."""
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise _bad(text, "an image has no spaces and is not empty")
    if "\x00" in text:
        raise _bad(text, "NUL byte")
    if text.endswith(".sif"):
        return SifImage(text)
    if text.startswith("docker://"):  # apptainer's spelling of the same reference
        text = text[len("docker://") :]
    elif "://" in text:
        raise _bad(text, "only docker:// references and .sif files are understood")
    name, digest = _split_digest(text)
    name, tag = _split_tag(text, name)
    registry, path = _split_registry(name)
    if registry is not None and not _DOMAIN.fullmatch(registry):
        raise _bad(text, f"{registry!r} is not a registry host[:port]")
    _check_path(text, path)
    if len(name) > _NAME_MAX:
        raise _bad(text, f"the name is longer than {_NAME_MAX} characters")
    return ImageRef(registry, path, tag, digest)


def _split_digest(text: str) -> tuple[str, str | None]:
    name, at, digest = text.partition("@")
    if not at:
        return text, None
    if not _DIGEST.fullmatch(digest):
        raise _bad(text, f"digest {digest!r} is not ALGORITHM:HEX (sha256:<64 hex digits>)")
    algorithm, _, hexa = digest.partition(":")
    if algorithm == "sha256" and len(hexa) != 64:
        raise _bad(text, f"a sha256 digest has 64 hex digits, not {len(hexa)}")
    return name, digest


def _split_tag(text: str, name: str) -> tuple[str, str | None]:
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon <= slash:  # a colon before the last slash is a registry's port
        return name, None
    tag = name[colon + 1 :]
    if not _TAG.fullmatch(tag):
        raise _bad(text, f"tag {tag!r}: letters, digits, _ . - (128 at most, not first . or -)")
    return name[:colon], tag


def _split_registry(name: str) -> tuple[str | None, str]:
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, name


def _check_path(text: str, path: str) -> None:
    if not path:
        raise _bad(text, "no image name")
    if path != path.lower():
        raise _bad(text, f"the repository {path!r} must be lowercase")
    for component in path.split("/"):
        if not _PATH_COMPONENT.fullmatch(component):
            raise _bad(
                text,
                f"{component!r}: a path component is lowercase letters and digits, "
                "joined by . _ __ or -",
            )


# -- mounts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """`--mount SRC:DST[:ro|rw]`: a host path seen at DST in the container."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


def _bad_mount(text: str, what: str) -> UsageError:
    return UsageError(
        f"--mount {text!r}: {what}",
        hint="give SRC:DST or SRC:DST:ro with absolute paths, e.g. --mount /data:/data:ro",
        code="bad-mount",
    )


def parse_mount(text: str) -> Mount:
    """`SRC:DST[:ro|rw]`, both absolute; no comma (pyxis and apptainer join mounts with
    commas) and no colon inside a path (every runtime splits on it)."""
    if "," in text:
        raise _bad_mount(text, "a path with a comma cannot be mounted (runtimes split on it)")
    if any(c in text for c in "\n\x00"):
        raise _bad_mount(text, "a newline or NUL in a path")
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise _bad_mount(text, "expected SRC:DST[:ro|rw] (a path cannot hold a colon)")
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise _bad_mount(text, f"mode {mode!r} is neither ro nor rw")
    source, target = parts[0], parts[1]
    for role, path in (("source", source), ("destination", target)):
        if not path.startswith("/"):
            raise _bad_mount(text, f"the {role} {path!r} is not an absolute path")
    target = posixpath.normpath(target)
    if target == "/" or ".." in target.split("/"):
        raise _bad_mount(text, f"the destination {parts[1]!r} cannot be / or go up with ..")
    return Mount(posixpath.normpath(source), target, mode == "ro")


MOUNT_PROBE = "container_mounts.sh"  # vmrun/hostside: prints the sources a host lacks


def mount_probe_args(mounts: list[Mount]) -> list[str]:
    """The arguments of MOUNT_PROBE (`sh -c SOURCE vmrun-container-mounts ARGS...`); its
    output, split in lines, is `check_mount_sources`' `missing`."""
    return list(dict.fromkeys(m.source for m in mounts))


def check_mount_sources(
    mounts: list[Mount], missing: set[str] | frozenset[str], host: str | None = None
) -> None:
    """Refuse the run before it starts when a mount's source is not on the host (`missing`:
    the sources a probe there did not find; Docker would create an empty root-owned one)."""
    for mount in mounts:
        if mount.source in missing:
            raise UsageError(
                f"--mount {mount}: {mount.source} does not exist",
                host=host,
                hint="create it there, or fix the path",
                code="mount-source-missing",
            )
