# A raw command (a byte stream, a listing) counted as vmrun's work while it runs:
#   sh ~/.vmrun/lib/<v>/command_mark.sh MARK CMD ARGS...
# MARK/<this shell's pid> holds this shell's start time until CMD ends, then MARK/.ended is
# touched, as command_wrapper.sh does for wrapped commands (the autostop watchdog reads
# both). stdin and stdout are CMD's, untouched.
m=$HOME/$1; shift
[ -d "$m" ] || mkdir -p "$m" 2>/dev/null
# shellcheck disable=SC2086  # the fields after the command name, split on purpose
(read -r l < /proc/$$/stat; set -- ${l##*) }; echo "${20}") 2>/dev/null > "$m/$$"
"$@"
r=$?
{ rm -f "$m/$$"; : > "$m/.ended"; } 2>/dev/null
exit "$r"
