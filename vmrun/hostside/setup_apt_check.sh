#!/bin/sh
# The check of an `apt:` step, needing no sudo: every package named ($@) is installed ("ii").
for p in "$@"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || exit 1
done
