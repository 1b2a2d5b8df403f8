# A run's command inside its container image, with run_provenance.py beside it, so the image's
# own Python describes the image's packages (the host's would describe nothing of the run):
#   sh run_in_image.sh PYTHON COLLECTOR REC CMD...
# PYTHON: the image's interpreter; COLLECTOR: run_provenance.py (vmrun's host-side folder, which
# the container mounts read-only at the host's path); REC: the run's record folder (mounted).
# The collector runs detached and niced; CMD replaces this shell.
py=$1 collector=$2 rec=$3
shift 3
nice=
command -v nice > /dev/null 2>&1 && nice="nice -n 10"
# in a subshell, so that it is not a child of CMD (which may wait for children of its own)
# shellcheck disable=SC2086  # `nice -n 10`, or nothing
( $nice "$py" "$collector" "$rec" < /dev/null > /dev/null 2>&1 & )
exec "$@"
