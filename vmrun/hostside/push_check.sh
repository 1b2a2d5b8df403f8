# Whether a push can land in DIR, in one round trip:
#   sh push_check.sh DIR NEEDED_KIB [STATE AGE]
# Makes DIR (and its parents), then prints one line: `ok FREE_KIB`, `nowrite` (DIR cannot
# be made or written by this user) or `nospace FREE_KIB` (the filesystem holding DIR has
# less than NEEDED_KIB free). DIR is relative to the home unless absolute. With STATE and
# AGE, host-to-host transfer keys a killed vmrun left (older than AGE seconds) go first
# (relay.sh revoke), in the same round trip.
dir=$1
needed=$2
if [ -n "${3:-}" ]; then
  sh "${0%/*}/relay.sh" revoke "$3" "" "$4" >/dev/null 2>&1
fi
if ! mkdir -p -- "$dir" 2>/dev/null || [ ! -w "$dir" ] || [ ! -d "$dir" ]; then
  echo nowrite
  exit 0
fi
free=$(df -Pk -- "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')
case $free in
  '' | *[!0-9]*) echo "ok unknown" ;;
  *)
    if [ "$free" -lt "$needed" ]; then
      echo "nospace $free"
    else
      echo "ok $free"
    fi
    ;;
esac
