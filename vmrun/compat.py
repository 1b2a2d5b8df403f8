"""What Python 3.10 lacks that vmrun uses: StrEnum (3.11). tomllib lives in vmrun.config."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised on 3.10 only

    class StrEnum(str, Enum):
        """An Enum whose members are their string values (printed and compared as such)."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]


__all__ = ["StrEnum"]
