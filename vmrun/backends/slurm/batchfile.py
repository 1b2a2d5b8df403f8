"""A user's own batch script as sbatch reads it: the `#SBATCH` options before its first
command, and what vmrun needs from them (the job's name, working directory, output and error
file patterns, array) to follow, show and fetch the job without changing a line of it.

sbatch's rules, kept here: options are read from `#SBATCH` lines until the first line that
is neither blank nor a comment; a later option wins; options given on sbatch's command line
override the script's; the default output file is `slurm-%j.out` (`slurm-%A_%a.out` for an
array) in the working directory, and the error file is the output file unless `--error`
names another.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun.errors import UsageError

# the options vmrun reads, by every name sbatch takes them under
_SHORT = {
    "-J": "--job-name",
    "-o": "--output",
    "-e": "--error",
    "-a": "--array",
    "-p": "--partition",
    "-A": "--account",
    "-q": "--qos",
    "-t": "--time",
    "-N": "--nodes",
    "-n": "--ntasks",
    "-D": "--chdir",
    "-c": "--cpus-per-task",
    "-G": "--gpus",
}
_FLAGS = frozenset(  # options that take no value (the next word is not theirs)
    {
        "--exclusive",
        "--requeue",
        "--no-requeue",
        "--overcommit",
        "--hold",
        "--parsable",
        "--wait",
        "--test-only",
        "--contiguous",
        "--spread-job",
        "--use-min-nodes",
        "--ignore-pbs",
        "--no-kill",
        "--oversubscribe",
        "--reboot",
        "--quiet",
        "--verbose",
        "-H",
        "-O",
        "-Q",
        "-W",
        "-k",
        "-s",
        "-v",
        "-h",
    }
)
# what a cluster's vmrun.toml may fill in where the script (and the command line) is silent
FILLED = ("--partition", "--account", "--qos")


@dataclass(frozen=True)
class Options:
    """sbatch options as (name, value) pairs in order: `--name` long forms, value None for a
    flag; the last of a name wins, as in sbatch."""

    pairs: tuple[tuple[str, str | None], ...] = ()

    def get(self, name: str) -> str | None:
        for key, value in reversed(self.pairs):
            if key == name:
                return value
        return None

    def __contains__(self, name: str) -> bool:
        return any(key == name for key, _ in self.pairs)

    def __add__(self, other: Options) -> Options:
        return Options(self.pairs + other.pairs)


def parse_words(words: Sequence[str]) -> Options:
    """Option words (`--time=10`, `--time 10`, `-t10`, `-t 10`) as long-form pairs."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-"):
            continue  # a stray word: sbatch would refuse it, and says so itself
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if not eq and name not in _FLAGS and i < len(words):
                value, i = words[i], i + 1
            pairs.append((name, value if (eq or name not in _FLAGS) else None))
            continue
        short, rest = word[:2], word[2:]
        name = _SHORT.get(short, short)
        if short in _FLAGS:
            pairs.append((name, None))
            continue
        if not rest and i < len(words):
            rest, i = words[i], i + 1
        pairs.append((name, rest.removeprefix("=")))
    return Options(tuple(pairs))


def header(text: str) -> Options:
    """The script's `#SBATCH` options, read as sbatch reads them."""
    words: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break  # the first command: sbatch reads no further
        if line.startswith("#SBATCH") and line[7:8] in (" ", "\t"):
            try:
                words += shlex.split(line[7:], comments=True)
            except ValueError:  # an unbalanced quote: sbatch reads the words as they are
                words += line[7:].split("#", 1)[0].split()
    return parse_words(words)


@dataclass(frozen=True)
class BatchFile:
    """The script and what sbatch will make of it with the command line's options."""

    path: Path  # on this machine
    relative: str  # in the project, as synced
    options: Options  # the script's, then the command line's (those win)

    @property
    def array(self) -> str | None:
        return self.options.get("--array")

    @property
    def job_name(self) -> str:
        return self.options.get("--job-name") or self.path.name

    @property
    def output(self) -> str:
        given = self.options.get("--output")
        return given or ("slurm-%A_%a.out" if self.array else "slurm-%j.out")

    @property
    def error(self) -> str:
        return self.options.get("--error") or self.output

    def output_folders(self) -> list[str]:
        """The folders the --output and --error patterns write in (relative to the job's
        working directory, or absolute), as sbatch reads them: sbatch makes none, and a job
        whose folder is missing fails before its first line with its output lost. `%x` is
        the job's name, `%u` left for the cluster's shell (the user there); a folder whose
        name needs the job's id or node (`%j`, `%N`...) is left out."""
        folders = set()
        for pattern in (self.output, self.error):
            head, slash, _ = pattern.rpartition("/")
            if not slash or not head:
                continue
            if "\\" in head:
                folders.add(head.replace("\\", ""))
                continue
            named = head.replace("%x", self.job_name).replace("%%", "\0")
            if re.search(r"%[0-9]*[A-Za-tv-z]", named):
                continue
            folders.add(named.replace("\0", "%"))
        return sorted(folders)

    def work_dir(self, submit_dir: str) -> str:
        """The job's working directory: --chdir (relative: to where sbatch ran), else where
        sbatch ran."""
        chdir = self.options.get("--chdir")
        if not chdir:
            return submit_dir
        return chdir if chdir.startswith("/") else f"{submit_dir}/{chdir}"


def as_glob(pattern: str) -> str:
    """A file name pattern as a glob matching every file it can name (`slurm-%A_%a.out`:
    `slurm-*_*.out`); a backslash turns replacements off, as in Slurm."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    return re.sub(r"%%|%[0-9]*[A-Za-z]", lambda m: "%" if m.group() == "%%" else "*", pattern)


def read(path: Path, project: Path, command_line: Options) -> BatchFile:
    """The script checked as sbatch would check it (it exists, is a file, starts with `#!`)
    and as vmrun needs it (inside the project, so that it is synced), with its options."""
    if not path.exists():
        raise UsageError(
            f"no batch script {path}",
            hint="give the path of your sbatch script",
            code="script-not-found",
        )
    if not path.is_file():
        raise UsageError(f"{path} is not a file", code="script-not-found")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", code="script-not-found") from None
    if not data.startswith(b"#!"):
        raise UsageError(
            f"{path} does not start with #! (sbatch runs a script by its interpreter line)",
            hint="make its first line `#!/bin/bash`",
            code="script-no-interpreter",
        )
    try:
        relative = path.resolve().relative_to(project.resolve()).as_posix()
    except ValueError:
        raise UsageError(
            f"batch script {path} is outside the project {project}, so it would not be synced",
            hint="run vmrun from the project, or move the script into it",
            code="script-not-synced",
        ) from None
    own = header(data.decode("utf-8", errors="replace"))
    return BatchFile(path, relative, own + command_line)


def command_line(
    given: Mapping[str, str | None], extra: Iterable[str] = ()
) -> tuple[list[str], Options]:
    """The words vmrun puts on sbatch's command line (`--name=value`, or `--name` for a flag)
    for the options the user gave, then the extra `--sbatch-arg` words, and those as Options."""
    words = [name if value is None else f"{name}={value}" for name, value in given.items()]
    words += list(extra)
    return words, parse_words(words)


def filled(script: Options, defaults: Mapping[str, str | None]) -> list[str]:
    """The cluster's defaults (vmrun.toml's partition, account, qos) for what neither the
    script nor the command line sets: the script rules."""
    return [
        f"{name}={value}"
        for name, value in defaults.items()
        if value and name in FILLED and name not in script
    ]
