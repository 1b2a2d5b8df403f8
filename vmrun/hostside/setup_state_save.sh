#!/bin/sh
# Two files written atomically each (a temp file, then mv): setup's state and the host record.
# $1: the state file, $2: its content, $3: the host record file, $4: its content.
mkdir -p "$(dirname "$1")" "$(dirname "$3")" &&
  printf '%s' "$2" >"$1.tmp" && mv "$1.tmp" "$1" &&
  printf '%s' "$4" >"$3.tmp" && mv "$3.tmp" "$3"
