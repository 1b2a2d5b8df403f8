#!/bin/sh
# While setup waits for a host to go down: the reboot command's exit status (once it ended)
# on the first line, then the last lines of its output; nothing while it still runs.
# $1: its exit status file, $2: its output file, $3: how many lines of output.
cat "$1" 2>/dev/null || exit 0
tail -n "$3" "$2" 2>/dev/null
