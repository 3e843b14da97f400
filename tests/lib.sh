# tests/lib.sh - what the test scripts share, sourced from the repository root: $tmp, a
# directory removed at exit; `report NAME STATUS WHY`, which prints PASS NAME or
# FAIL NAME: WHY and, on a failure, sets fail=1 (the script's exit status); and
# `need_built NAME PROGRAM`, which fails the script at once when make has not built it;
# `free_port`, a TCP port that nothing listens on now (for ranks started by hand).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
report() { # name ok why
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fail=1; fi
}
need_built() { # name program
  local rel=${2#"$PWD"/}
  [ -x "$2" ] || { echo "FAIL $1: $2 is not built (make ${rel#./})"; exit 1; }
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + $$ % 20000))
}
