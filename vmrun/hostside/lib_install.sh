# Places vmrun's host-side files (vmrun.ssh.hostlib): sh -c SOURCE vmrun-lib-install DIR
# stdin: a gzipped tar of the files to (re)place, MANIFEST among them. They are unpacked
# into a folder inside DIR, then each is renamed over its place (a command running a script
# by path reads the old text or the new, never half of one), MANIFEST last, readable by the
# user alone. Exits 0 once `sha256sum -c MANIFEST` passes.
umask 077
d=$HOME/$1
mkdir -p "$d" || exit 1
t=$(mktemp -d "$d/.install.XXXXXX") || exit 1
trap 'rm -rf "$t"' EXIT
mkdir "$t/f" || exit 1
gzip -dc | tar -x -o -f - -C "$t/f" || exit 1
mv -f "$t/f/MANIFEST" "$t/MANIFEST" || exit 1
# one mv for them all: a process per file was 60 processes a host (64 hosts at once: the
# first command's CPU on a small machine)
set -- "$t"/f/*
if [ -e "$1" ]; then mv -f "$@" "$d/" || exit 1; fi
mv -f "$t/MANIFEST" "$d/MANIFEST" || exit 1
cd "$d" && sha256sum -c --quiet MANIFEST
