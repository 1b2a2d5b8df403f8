"""The check of a `pip:` step, run by the env's interpreter: every requirement (argv) is
installed and satisfies its version spec. Anything that is not a plain requirement (a file,
a URL, an option) fails the check, so pip decides. Stdlib only (packaging from pip if need be)."""

import importlib.metadata as md
import sys

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

for text in sys.argv[1:]:
    try:
        req = Requirement(text)
    except Exception:
        sys.exit(1)
    if req.url:
        sys.exit(1)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(have, prereleases=True):
        sys.exit(1)
