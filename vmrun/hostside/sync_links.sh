# sh THIS THIS WORKDIR < "target\0path\0..." (vmrun.sync.engine): make each
# symlink unless it is already there; prints `L` per link made. ln to a temporary name,
# then mv -T: atomic. THIS is this script's own path: xargs runs it once per pair as
# `sh THIS THIS --one TARGET PATH` (POSIX sh cannot read NUL-separated input).
self=$1
if [ "$2" = --one ]; then
  t=$3 p=$4
  if [ -L "$p" ] && [ "$(readlink -- "$p"; echo x)" = "$t
x" ]; then exit 0; fi
  mkdir -p -- "$(dirname -- "$p")" && ln -sfn -- "$t" "$p.vmrun-link" &&
    mv -f -T -- "$p.vmrun-link" "$p" && echo L
  exit
fi
cd -- "$2" || exit 3
exec xargs -0 -n 2 sh "$self" "$self" --one
