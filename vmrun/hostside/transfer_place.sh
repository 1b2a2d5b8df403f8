# sh transfer_place.sh DIR PLACE_PY < "tmp\0final\0..." (vmrun.transfer.upload):
# rename each pair, never into a directory; with python3 in one process (PLACE_PY is
# transfer_place.py's path; 2,000 files: 30 ms), else one `mv -T` per file (2,000: ~3 s).
cd -- "$1" || exit 1
if command -v python3 >/dev/null 2>&1; then exec python3 "$2"; fi
exec xargs -0 -n 2 mv -f -T --
