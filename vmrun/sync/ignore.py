"""gitignore matching, for projects that are not git work trees and for `.vmrunignore`.

Git's own rules (gitignore(5)), because users write these files for git and expect the
same answer: blank lines and `#` comments are skipped, trailing spaces dropped unless
escaped; `!` negates; a trailing `/` matches directories only; a pattern with a `/` at its
start or middle is anchored to the ignore file's folder, one without matches a name at any
depth; `*`, `?` and `[...]` never match `/`; `**/`, `/**/` and a trailing `/**` cross
folders; the last matching line wins; and nothing under an excluded directory can be
re-included (git never looks inside it). Case-sensitive, as git is on Linux.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_CLASSES = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "blank": " \\t",
    "digit": "0-9",
    "lower": "a-z",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9a-fA-F",
}


@dataclass(frozen=True)
class Rule:
    """One pattern line, from an ignore file in folder `base` ("" = the project root)."""

    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    anchored: bool  # matched against the whole path below `base`, else against the name
    base: str
    text: str  # the line, for messages


def _bracket(pattern: str, i: int) -> tuple[str, int] | None:
    """Translate the `[...]` starting at pattern[i]; None when it is not closed (literal)."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] in "!^"
    if negate:
        j += 1
    parts: list[str] = []
    first = True
    while j < len(pattern):
        c = pattern[j]
        if c == "]" and not first:
            body = "".join(parts)
            return (f"[^/{body}]" if negate else f"(?!/)[{body}]"), j + 1
        first = False
        if c == "[" and pattern.startswith("[:", j):
            end = pattern.find(":]", j + 2)
            if end != -1 and pattern[j + 2 : end] in _CLASSES:
                parts.append(_CLASSES[pattern[j + 2 : end]])
                j = end + 2
                continue
        if c == "\\" and j + 1 < len(pattern):
            j += 1
            c = pattern[j]
        if c == "-" and parts and j + 1 < len(pattern) and pattern[j + 1] != "]":
            parts.append("-")
        else:
            parts.append(re.escape(c))
        j += 1
    return None


def _glob_regex(pattern: str) -> str:
    """git's wildmatch (with WM_PATHNAME) as a regular expression body."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            stars = j - i
            at_start = i == 0 or pattern[i - 1] == "/"
            at_end = j == n or pattern[j] == "/"
            if stars >= 2 and at_start and at_end:
                if j == n:  # `x/**`: everything inside (`**` alone: everything)
                    out.append(".*")
                    i = j
                else:  # `**/`: zero or more folders
                    out.append("(?:.*/)?")
                    i = j + 1
                continue
            out.append("[^/]*")  # other runs of stars are one star
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            got = _bracket(pattern, i)
            if got is None:
                out.append(re.escape(c))
                i += 1
            else:
                out.append(got[0])
                i = got[1]
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _strip_trailing_spaces(line: str) -> str:
    end = len(line)
    while end > 0 and line[end - 1] == " ":
        backslashes = 0
        k = end - 2
        while k >= 0 and line[k] == "\\":
            backslashes += 1
            k -= 1
        if backslashes % 2:  # `\ `: an escaped space stays
            break
        end -= 1
    return line[:end]


def parse_line(line: str, base: str = "") -> Rule | None:
    """One ignore-file line as a Rule; None for blanks and comments."""
    text = line.rstrip("\r\n")
    line = _strip_trailing_spaces(text)
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate or line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    if dir_only:
        line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.removeprefix("/")
    regex = re.compile(_glob_regex(line), re.DOTALL)
    return Rule(regex, negate, dir_only, anchored, base, text)


def parse(text: str, base: str = "") -> list[Rule]:
    """Every rule of an ignore file's text; `base` is its folder relative to the project."""
    return [r for r in (parse_line(ln, base) for ln in text.splitlines()) if r is not None]


def rule_matches(rule: Rule, path: str, is_dir: bool) -> bool:
    """Whether `rule` matches `path` (POSIX, relative to the project; no trailing `/`)."""
    if rule.dir_only and not is_dir:
        return False
    if rule.base:
        if not path.startswith(rule.base + "/"):
            return False
        path = path[len(rule.base) + 1 :]
    subject = path if rule.anchored else path.rpartition("/")[2]
    return rule.regex.fullmatch(subject) is not None


def decide(rules: Iterable[Rule], path: str, is_dir: bool) -> bool | None:
    """True: ignored; False: re-included by a `!` line; None: no line matches."""
    verdict: bool | None = None
    for rule in rules:
        if rule_matches(rule, path, is_dir):
            verdict = not rule.negate
    return verdict


class Matcher:
    """Decides paths against an ordered rule list, with git's rule that an excluded folder
    hides everything under it; folder answers are cached (a tree repeats them).

    `dir_hook(path)` is a rule below every line (a folder it names is ignored unless a line
    matches the folder): how "any folder holding pyvenv.cfg" works, `!` included.
    """

    def __init__(self, rules: Iterable[Rule] = (), dir_hook: Callable[[str], bool] | None = None):
        self.rules = list(rules)
        self.dir_hook = dir_hook
        self._dirs: dict[str, bool] = {}

    def dir_ignored(self, path: str) -> bool:
        """Whether folder `path` or one above it is ignored."""
        if path in self._dirs:
            return self._dirs[path]
        parent = path.rpartition("/")[0]
        ignored = parent != "" and self.dir_ignored(parent)
        if not ignored:
            verdict = decide(self.rules, path, True)
            if verdict is None and self.dir_hook is not None:
                verdict = self.dir_hook(path)
            ignored = bool(verdict)
        self._dirs[path] = ignored
        return ignored

    def ignored(self, path: str, is_dir: bool = False) -> bool:
        if is_dir:
            return self.dir_ignored(path)
        parent = path.rpartition("/")[0]
        if parent and self.dir_ignored(parent):
            return True
        return bool(decide(self.rules, path, False))
