"""The shell text a step runs: its check (apt and pip steps get one of their own), its apply
(with the apt helpers before it), and what --dry-run shows of it."""

from __future__ import annotations

import re
from collections.abc import Mapping

from vmrun.setup.playbook import Step
from vmrun.ssh import quoting

# Shell functions every apply script can call (see playbooks/default.yaml's header). The lock
# holder comes from /proc/locks, which lists every POSIX lock as PID MAJ:MIN:INODE and which
# any user can read: fuser and lsof cannot see root's processes without root.
SHELL_HELPERS = r"""
vmrun_apt_holders() {
  local f dev ino key pid cmd
  local files="/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock"
  for f in ${VMRUN_APT_LOCK_FILES:-$files /var/cache/apt/archives/lock}; do
    read -r dev ino < <(stat -c '%d %i' "$f" 2>/dev/null) || continue
    key=$(printf '%02x:%02x:%s' $(((dev >> 8) & 0xfff)) \
      $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")
    awk -v k="$key" '$2 != "->" && $6 == k { print $5 }' /proc/locks
  done | sort -u | while read -r pid; do
    if [ "$pid" -gt 0 ] 2>/dev/null; then
      cmd=$(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline | cut -c1-60 | sed 's/ *$//')
      printf 'pid %s (%s)\n' "$pid" "$cmd"
    else
      echo "a process vmrun cannot name (an open file description lock)"
    fi
  done
  return 0
}
vmrun_apt_wait() {
  local limit=${VMRUN_APT_LOCK_WAIT:-300} start=$SECONDS holders said=""
  while holders=$(vmrun_apt_holders); [ -n "$holders" ]; do
    holders=${holders//$'\n'/; }
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      echo "the apt/dpkg lock is still held after ${limit} s, by $holders" >&2
      echo "on a fresh cloud VM that is usually unattended-upgrades: let it finish" \
        "(or stop it) and re-run; --param apt_lock_wait=SECONDS waits longer" >&2
      return 1
    fi
    if [ "$holders" != "$said" ]; then
      echo "waiting up to ${limit} s for the apt/dpkg lock, held by $holders" >&2
      said=$holders
    fi
    sleep 1
  done
}
vmrun_apt_get() {
  vmrun_apt_wait
  $VMRUN_SUDO apt-get -o DPkg::Lock::Timeout="${VMRUN_APT_LOCK_WAIT:-300}" "$@"
}
vmrun_apt_update() {
  local mark="$HOME/.vmrun/setup/apt-updated"
  if [ "$(cat "$mark" 2>/dev/null)" = "$VMRUN_SETUP_RUN" ]; then return 0; fi
  vmrun_apt_get update
  mkdir -p "${mark%/*}" && printf '%s' "$VMRUN_SETUP_RUN" >"$mark"
}
vmrun_apt_install() {
  vmrun_apt_update
  vmrun_apt_get install -y "$@"
}
"""

# The check of a `pip:` step: every requirement is installed in the env and satisfies its
# version spec. Anything that is not a plain requirement (a file, a URL, an option) fails the
# check, so pip decides.
PIP_CHECK = """import importlib.metadata as md, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
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
"""


def check_script(step: Step) -> str:
    """The step's check; apt and pip steps without one get a read-only check of their own."""
    if step.apt:
        names = " ".join(quoting.quote(p) for p in step.apt)
        return (
            f"for p in {names}; do dpkg-query -W -f='${{db:Status-Abbrev}}' \"$p\""
            " 2>/dev/null | grep -q '^ii' || exit 1; done"
        )
    if step.pip and not step.check:
        # the env may have been made again since (another env manager or name, a forced
        # python-env): then the requirements are missing and the step must run again
        reqs = " ".join(quoting.quote(p) for p in step.pip)
        return f"\"$VMRUN_PYTHON\" - {reqs} <<'EOF'\n{PIP_CHECK}EOF"
    return step.check


def apply_script(step: Step) -> str:
    """The step's own script (SHELL_HELPERS are prepended when it runs)."""
    if step.apt:
        pkgs = " ".join(quoting.quote(p) for p in step.apt)
        return f"vmrun_apt_install {pkgs}"
    if step.pip:
        reqs = " ".join(quoting.quote(p) for p in step.pip)
        return f'"$VMRUN_PYTHON" -m pip install $VMRUN_PIP_EXTRA_ARGS {reqs}'
    return step.apply


def dry_run_text(step: Step, env: Mapping[str, str]) -> str:
    """The apply (and verify) script, preceded by the values of the variables it uses."""
    script = apply_script(step)
    if step.verify:
        script += "\n# then verify:\n" + step.verify
    used = sorted(set(re.findall(r"\$\{?(VMRUN_[A-Z0-9_]+)", script)))
    values = [f"# {name}={env.get(name, '')}" for name in used]
    return "\n".join([*values, script.rstrip()])
