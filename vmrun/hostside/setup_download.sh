# Download helpers every apply script can call (playbooks/default.yaml's header lists them), so
# that setup can show a download's progress live: vmrun reads the step's output a line at a
# time (vmrun.setup.progress). POSIX sh; each body is a subshell, so its variables stay its own.
#
# vmrun_pip_install PYTHON ARGS...: `PYTHON -m pip install --disable-pip-version-check ARGS`,
# with `--progress-bar raw` where that pip has it (24.1 and later: a `Progress CUR of TOTAL`
# line every quarter second). Older pips refuse the option; they print a `Downloading NAME
# (SIZE)` line, and one finished bar line at the end, which is what vmrun shows for them.
vmrun_pip_install() (
  python=$1
  shift
  if "$python" -c 'import sys, pip
sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (24, 1))' 2>/dev/null; then
    "$python" -m pip install --disable-pip-version-check --progress-bar raw "$@"
  else
    "$python" -m pip install --disable-pip-version-check "$@"
  fi
)
# vmrun_fetch URL FILE: curl URL to FILE, saying `Downloading NAME` first, then its progress
# meter one row per line: curl ends each row with a carriage return, and vmrun would see them
# only when the download ends (and tr, writing to a pipe, holds its output: hence stdbuf).
# curl's own exit status is the function's.
vmrun_fetch() (
  echo "Downloading ${1##*/}" >&2
  unbuffered=""
  if command -v stdbuf >/dev/null 2>&1; then unbuffered="stdbuf -oL"; fi
  # shellcheck disable=SC2086 # an empty word list when there is no stdbuf
  status=$({ { curl -fSL -o "$2" "$1" 2>&1; echo "$?" >&3; } | $unbuffered tr '\r' '\n' >&2; } 3>&1)
  return "$status"
)
