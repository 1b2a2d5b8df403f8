# sh -c THIS vmrun-fresh DIR ASIDE REL... (vmrun train --fresh): move each checkpoint file
# DIR/REL to DIR/ASIDE/REL, a rename within the same folder tree: never a copy, never a
# delete. A file already gone (another node moved it on a shared filesystem) is skipped;
# an existing target is never overwritten. Prints how many files were moved.
cd "$HOME" || exit 1
dir=$1 aside=$2
shift 2
moved=0
for rel do
  from="$dir/$rel" to="$dir/$aside/$rel"
  [ -e "$from" ] || continue
  if [ -e "$to" ] || [ -L "$to" ]; then
    printf '%s exists already; nothing more was moved\n' "$to" >&2
    exit 3
  fi
  mkdir -p -- "$(dirname -- "$to")" || exit 1
  if mv -- "$from" "$to"; then
    moved=$((moved + 1))
  elif [ -e "$from" ]; then
    exit 1
  fi
done
echo "$moved"
