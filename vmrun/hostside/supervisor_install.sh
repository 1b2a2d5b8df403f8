# The supervisor's Python env (`train --recover`, vmrun.recovery.deploy), made once per set
# of requirements:  sh supervisor_install.sh ENV WHEELS PYTHON REQUIREMENT...
# ENV: the venv to make (relative to the home), WHEELS: the folder of wheels vmrun sent (pip
# installs from it alone, --no-index: the host needs no index), PYTHON: the interpreter the
# venv is made from. A venv whose `.requirements` file already says the same requirements
# is left as it is (`SAME`); else it is made anew (`MADE`). Exit 3 with pip's or venv's last
# lines when it cannot be made.
env=$1 wheels=$2 py=$3
shift 3
cd "$HOME" || exit 1
want=$(printf '%s\n' "$@")
if [ -x "$env/bin/python" ] && [ -f "$env/.requirements" ] \
  && [ "$(cat "$env/.requirements")" = "$want" ]; then
  echo SAME
  exit 0
fi
rm -rf "$env"
mkdir -p "${env%/*}" || exit 1
out=$("$py" -m venv "$env" 2>&1) || {
  printf '%s\n' "$out" | tail -n 5
  rm -rf "$env"
  exit 3
}
out=$("$env/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  --find-links "$wheels" "$@" 2>&1) || {
  printf '%s\n' "$out" | tail -n 5
  rm -rf "$env"
  exit 3
}
printf '%s\n' "$want" > "$env/.requirements"
echo MADE
