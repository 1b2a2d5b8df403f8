# A connection's first command runs under this guard (vmrun.ssh.hostlib):
#   sh -c SOURCE vmrun-lib DIR HASH COMMAND
# DIR (relative to the home) holds this vmrun's host-side files and their MANIFEST
# (sha256sum lines). If MANIFEST's own sha256 is HASH and every file matches its line,
# COMMAND (a command line quoted for sh) runs. Else nothing runs: the stale files' names
# (`*`: all of them) go to stderr after `vmrun-lib-stale`, the exit status is 97, and vmrun
# sends those files (lib_install.sh) and runs COMMAND again.
set -f
l=$HOME/$1
if [ "$(cd "$l" 2>/dev/null && sha256sum MANIFEST 2>/dev/null)" = "$2  MANIFEST" ]; then
  bad=$(cd "$l" && sha256sum -c MANIFEST 2>/dev/null | sed -n 's/: FAILED.*$//p')
else
  bad='*'
fi
if [ -z "$bad" ]; then eval "$3"; exit; fi
# shellcheck disable=SC2086  # one name per word, on one line
echo vmrun-lib-stale $bad >&2
exit 97
