#!/bin/sh
# While setup waits for a host to reboot: its boot_id on the first line (another one than
# before: it has rebooted), then the reboot command's exit status (once it ended) and the
# last lines of its output; nothing more while it still runs.
# $1: its exit status file, $2: its output file, $3: how many lines of output.
cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo
cat "$1" 2>/dev/null || exit 0
tail -n "$3" "$2" 2>/dev/null
