"""Reading an image pull: its output as progress (layers done of total, bytes where the
output has them), its failure as one error with a stable code.

`docker pull` without a terminal prints one line per layer event (`ID: Pulling fs layer`,
`Download complete`, `Pull complete`, `Already exists`) and drops the byte counts, which
it shows only as progress bars on a terminal; the Engine API's JSON stream
(`POST /images/create`) carries them (`progressDetail`). Both are read here, and podman's
`Copying blob` lines (byte counts too on a terminal), so the live view shows what the
host's pull gives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from vmrun.errors import RemoteError, UsageError, VmrunError

PENDING, DOWNLOADING, DOWNLOADED, DONE = "pending", "downloading", "downloaded", "done"
_STATES = {  # a layer event's words -> the layer's state
    "Pulling fs layer": PENDING,
    "Waiting": PENDING,
    "Downloading": DOWNLOADING,
    "Verifying Checksum": DOWNLOADING,
    "Download complete": DOWNLOADED,
    "Extracting": DOWNLOADED,
    "Pull complete": DONE,
    "Already exists": DONE,
}
_LAYER = re.compile(r"([0-9a-f]{12,64}): (.*)")
_PODMAN_BLOB = re.compile(r"Copying blob (?:sha256:)?([0-9a-f]{12,64})\s*(.*)")
_SIZE = re.compile(r"([0-9.]+)\s*([kKMG]?B)/([0-9.]+)\s*([kKMG]?B)")  # a terminal's "12.5MB/45MB"
# podman's bar on a terminal: "Copying blob 2fec26bb3f76 [=====>---] 1.5MiB / 45.0MiB"
_PODMAN_SIZE = re.compile(r"([0-9.]+)\s*([KMG]iB|b)\s*/\s*([0-9.]+)\s*([KMG]iB|b)")
_UNITS = {
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "b": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
}


@dataclass(frozen=True)
class PullProgress:
    """Where a pull stands: layers (done of total), bytes (None where the output has none),
    the digest once known, and whether the image was already there (`up_to_date`)."""

    layers_total: int = 0
    layers_done: int = 0
    layers_downloaded: int = 0
    bytes_done: int | None = None
    bytes_total: int | None = None
    digest: str | None = None
    up_to_date: bool | None = None  # None until the pull says which


@dataclass
class PullReader:
    """Feed it the pull's output lines, one at a time; `progress` is the state so far."""

    layers: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    digest: str | None = None
    up_to_date: bool | None = None
    errors: list[str] = field(default_factory=list)  # a JSON stream's error messages
    skipped: set[str] = field(default_factory=set)  # podman's "skipped: already exists"

    def feed(self, line: str) -> bool:
        """Read one line; True when it changed the progress."""
        line = line.strip()
        if line.startswith("{"):
            return self._json(line)
        if line.startswith("Digest: "):
            self.digest = line.split(None, 1)[1]
            return True
        if line.startswith("Status: "):
            self.up_to_date = "up to date" in line
            return True
        blob = _PODMAN_BLOB.fullmatch(line)
        if blob:
            layer, rest = blob.group(1)[:12], blob.group(2)
            if rest.startswith("skipped"):
                self.skipped.add(layer)
            size = _PODMAN_SIZE.search(rest)
            if size:
                self.sizes[layer] = (
                    round(float(size.group(1)) * _UNITS[size.group(2)]),
                    round(float(size.group(3)) * _UNITS[size.group(4)]),
                )
                if self.layers.get(layer) != DONE:
                    self.layers[layer] = DOWNLOADING
                return True
            done = rest.startswith(("done", "skipped"))
            return self._layer(layer, DONE if done else DOWNLOADING)
        layer = _LAYER.fullmatch(line)
        if layer:
            return self._event(layer.group(1), layer.group(2))
        return False

    def _event(self, layer: str, words: str) -> bool:
        state = next((s for w, s in _STATES.items() if words.startswith(w)), None)
        if state is None:
            return False
        size = _SIZE.search(words)
        if size and state == DOWNLOADING:
            current = round(float(size.group(1)) * _UNITS.get(size.group(2), 1))
            total = round(float(size.group(3)) * _UNITS.get(size.group(4), 1))
            self.sizes[layer] = (current, total)
        return self._layer(layer, state)

    def _layer(self, layer: str, state: str) -> bool:
        if self.layers.get(layer) == DONE or self.layers.get(layer) == state:
            return False
        self.layers[layer] = state
        if state in (DOWNLOADED, DONE) and layer in self.sizes:
            total = self.sizes[layer][1]
            self.sizes[layer] = (total, total)
        return True

    def _json(self, line: str) -> bool:
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict):
            return False
        status, layer = str(message.get("status", "")), message.get("id")
        error = message.get("error") or (None if status else message.get("message"))
        if error:  # a failure mid-stream, or the whole answer of a refused request (HTTP 404)
            self.errors.append(str(error))
            return True
        detail = message.get("progressDetail") or {}
        if layer and status == "Downloading" and detail.get("total"):
            self.sizes[layer] = (int(detail.get("current", 0)), int(detail["total"]))
            self.layers[layer] = DOWNLOADING
            return True
        if layer and not status.startswith(("Digest", "Status")):
            return self._event(str(layer), status)
        return self.feed(status) if status else False

    def progress(self) -> PullProgress:
        states = list(self.layers.values())
        sized = self.sizes.values()
        return PullProgress(
            layers_total=len(states),
            layers_done=states.count(DONE),
            layers_downloaded=sum(s in (DOWNLOADED, DONE) for s in states),
            bytes_done=sum(c for c, _ in sized) if self.sizes else None,
            bytes_total=sum(t for _, t in sized) if self.sizes else None,
            digest=self.digest,
            up_to_date=self._up_to_date(states),
        )

    def _up_to_date(self, states: list[str]) -> bool | None:
        """docker's "Status:" line, else (podman says none) once every layer is done:
        whether every one was skipped as already there."""
        if self.up_to_date is not None or not states or states.count(DONE) < len(states):
            return self.up_to_date
        return self.skipped >= set(self.layers)


MARK = b"\x1dvmrun "  # hostside/container_pull.sh's own lines: `image ID`, `kept WHY`


class PullLines:
    """A pull's output as it comes, in chunks (a terminal's redraws end in \\r), read line
    by line; `on_change` is told the progress whenever a line changed it. `text` keeps the
    last lines (a failure's words)."""

    def __init__(self, on_change: Callable[[PullProgress], None] | None = None) -> None:
        self.reader, self.rest = PullReader(), b""
        self.on_change = on_change
        self.text: list[str] = []
        self.image_id: str | None = None  # the pull script's `image ID`: what the node runs
        self.kept = ""  # why the host's own copy was kept (pull = newer, registry not there)

    def __call__(self, stream: str, data: bytes) -> None:
        lines = (self.rest + data).replace(b"\r", b"\n").split(b"\n")
        self.rest = lines.pop()
        for raw in lines:
            if raw.startswith(MARK):
                word, _, rest = raw[len(MARK) :].decode("utf-8", "replace").partition(" ")
                if word == "image":
                    self.image_id = rest.strip() or None
                elif word == "kept":
                    self.kept = rest.strip()
                continue
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            self.text.append(line)
            del self.text[:-200]
            if self.reader.feed(line) and self.on_change is not None:
                self.on_change(self.reader.progress())

    def close(self) -> PullProgress:
        """The last line, if it had no end; the progress the pull ended at."""
        self("out", b"\n")
        return self.reader.progress()

    def summary(self, image: str, seconds: float) -> str:
        if self.kept:
            return (
                f"kept this host's own {image}: its registry did not answer or has no"
                f" such image ({self.kept}; pull = newer)"
            )
        done = self.reader.progress()
        if not done.layers_total and not self.text:  # nothing pulled: missing, never
            return f"image {image} is on the host; not pulled"
        if done.up_to_date:
            return f"image {image} is there already ({seconds:.1f} s)"
        size = f", {done.bytes_total / 2**20:.0f} MiB" if done.bytes_total else ""
        return f"pulled {image} ({done.layers_total} layers{size}, {seconds:.1f} s)"


def read_pull(output: str) -> PullProgress:
    """The progress a whole recorded output ends at."""
    reader = PullReader()
    for line in output.splitlines():
        reader.feed(line)
    return reader.progress()


# -- failures -------------------------------------------------------------------------------
# (pattern in the output, the error it is, what happened); the first that matches wins, so
# the narrower come first ("repository does not exist ... denied" is a missing image on
# Docker Hub, which says so for a private one too).
_FAILURES: tuple[tuple[str, Callable[..., VmrunError], str], ...] = (
    (
        r"\b(docker|podman): (command )?not found|executable file not found",
        partial(
            UsageError,
            code="container-runtime-missing",
            hint="`vmrun setup --container docker` installs it",
        ),
        "the container runtime is not installed",
    ),
    (
        r"no space left on device",
        partial(
            RemoteError,
            code="no-space-left",
            hint="free space (docker system prune) or grow the disk",
        ),
        "no space left on the host's disk pulling {image}",
    ),
    (
        r"permission denied while trying to connect to the (Docker )?daemon",
        partial(
            RemoteError,
            code="container-runtime-unavailable",
            hint="`vmrun setup --container docker` adds the user to the docker group",
        ),
        "the user may not use the Docker daemon",
    ),
    (
        r"Cannot connect to the (Docker|container) daemon|Is the docker daemon running",
        partial(
            RemoteError,
            code="container-runtime-unavailable",
            hint="start it (systemctl start docker) or run `vmrun setup --container docker`",
        ),
        "the Docker daemon is not running",
    ),
    (
        r"invalid reference format|short-name .* did not resolve",
        partial(
            UsageError,
            code="bad-image",
            hint="give the full name, e.g. docker.io/library/python:3.12",
        ),
        "the runtime refused the reference {image}",
    ),
    (
        r"manifest unknown|manifest for \S+ not found|name unknown|repository does not exist"
        r"|requested access to the resource is denied|: not found\s*$",
        partial(
            UsageError,
            code="image-not-found",
            hint="check the name and tag (a private repository also needs a login)",
        ),
        "no image {image} in its registry",
    ),
    (
        r"unauthorized|authentication required|incorrect username or password|\bdenied\b",
        partial(
            RemoteError,
            code="registry-auth-refused",
            hint="check the login (NGC: NGC_API_KEY, username $oauthtoken)",
        ),
        "the registry refused the credentials for {image}",
    ),
    (
        r"dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout"
        r"|Client\.Timeout exceeded|network is unreachable|name resolution"
        r"|server gave HTTP response to HTTPS client|x509:",
        partial(
            RemoteError,
            code="registry-unreachable",
            hint="check the host's network, DNS, proxy and the registry's certificate",
        ),
        "the host could not reach the registry of {image}",
    ),
)
_DETAIL_MAX = 200


def _detail(output: str) -> str:
    """The runtime's own words: its last error line, shortened, as one line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "rror" in line or "denied" in line] or lines
    text = errors[-1] if errors else ""
    for prefix in ("docker: ", "Error response from daemon: ", "Error: "):
        text = text.removeprefix(prefix)
    return text[:_DETAIL_MAX] + ("..." if len(text) > _DETAIL_MAX else "")


def pull_error(output: str, image: str, host: str | None = None) -> VmrunError:
    """The one error a failed pull is, from its output (stderr, or a JSON stream's errors)."""
    detail = _detail(output)
    for pattern, error, what in _FAILURES:
        if re.search(pattern, output, re.IGNORECASE | re.MULTILINE):
            message = what.format(image=image)
            return error(f"{message} ({detail})" if detail else message, host=host)
    return RemoteError(
        f"pulling {image} failed ({detail or 'no output'})",
        host=host,
        hint="run the pull on the host to see why",
        code="pull-failed",
    )


NOT_HERE = 3  # hostside/container_pull.sh: pull = never, and no such image there


def not_here(image: str, host: str | None) -> UsageError:
    """pull = never, and the host (None: this machine) has no such image."""
    where = f"on {host}" if host else "here"
    return UsageError(
        f"no image {image} {where}, and pull = never",
        host=host,
        hint="load or build it there (docker load), or allow a pull: --pull missing",
        code="image-not-here",
    )
