#!/bin/sh
# Every step's check in one round trip: NAME SCRIPT pairs as arguments. Each check runs in its
# own bash (the playbook's scripts are bash; --norc: no rc file runs under -u), read-only by
# contract; "PASS NAME" is printed for each that exits 0.
while [ "$#" -ge 2 ]; do
  if bash --norc -eu -c "$2" >/dev/null 2>&1 </dev/null; then echo "PASS $1"; fi
  shift 2
done
