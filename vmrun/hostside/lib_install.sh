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
gzip -dc | tar -x -o -f - -C "$t" || exit 1
for f in "$t"/*; do
  n=${f##*/}
  if [ "$n" != MANIFEST ]; then mv -f "$f" "$d/$n" || exit 1; fi
done
mv -f "$t/MANIFEST" "$d/MANIFEST" || exit 1
cd "$d" && sha256sum -c --quiet MANIFEST
