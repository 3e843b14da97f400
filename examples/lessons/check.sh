#!/bin/sh
# check.sh - runs a lesson's exercise (or its solution) with 3, 1, 2, 4, 5 and 7 ranks
# and says "correct", or shows the first run that went wrong with its hint. `make
# lesson-N` builds the exercise and calls this:
#   examples/lessons/check.sh examples/lessons/03_sampler/exercise
# In Chinese when LC_ALL, LC_MESSAGES or LANG (the first one set) starts with "zh",
# as the exercises' own messages; HINT=2 reaches the exercise and adds its second hint.
bin=$1
case ${LC_ALL:-${LC_MESSAGES:-$LANG}} in zh*) zh=1 ;; *) zh= ;; esac
say() { if [ -n "$zh" ]; then printf '%s\n' "$2"; else printf '%s\n' "$1"; fi; }
if [ ! -x "$bin" ]; then
  say "check.sh: '$bin' is not a built program: run make lesson-N from the repository root" \
      "check.sh：'$bin' 不是编译好的程序：请在仓库根目录运行 make lesson-N"
  exit 2
fi
lesson=$(basename "$(dirname "$bin")")
lesson=${lesson%%_*}
lesson=${lesson#0}
out=$(mktemp) || exit 2
pid=
# timeout runs each try in a process group of its own (its pid): whatever the try leaves
# running, and the try itself when make is stopped with Ctrl-C, ends with that group
trap 'rm -f "$out"' EXIT
trap '[ -n "$pid" ] && kill -KILL -$pid 2>/dev/null; exit 130' INT
trap '[ -n "$pid" ] && kill -KILL -$pid 2>/dev/null; exit 143' TERM
# the processes of group $1 that have not ended (a zombie has, also where nobody reaps it)
alive() {
  if [ -r /proc/self/stat ]; then
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v g="$1" '{ sub(/.*\) /, ""); if ($3 == g && $1 != "Z") n++ } END { exit !n }'
  else
    kill -0 -"$1" 2>/dev/null
  fi
}
# The exercises use no OpenMP: a thread count keeps the launcher's note about it away.
# A rank left waiting is named by ddp.h after 20 s; timeout is the last resort.
export OMP_NUM_THREADS=1 DDP_TIMEOUT=20
for w in 3 1 2 4 5 7; do
  timeout 60 "$bin" --nproc $w >"$out" 2>&1 &
  pid=$!
  wait $pid
  rc=$?
  left=
  if alive $pid; then
    left=1
    kill -KILL -$pid 2>/dev/null
  fi
  pid=
  wrong=1
  # the verdict is rank 0's "correct:" line; a status of 0 alone may be a return before it
  if [ $rc -eq 0 ] && [ -n "$left" ]; then
    cat "$out"
    say "(the run ended, but left processes running: stopped now)" "（运行结束了，却留下了仍在运行的进程：已将它们停止）"
  elif [ $rc -eq 0 ] && ! grep -q '^correct: \|^正确：' "$out"; then
    cat "$out"
    say "(the run ended with status 0 but printed no verdict: main() did not reach its check)" \
        "（运行以状态 0 结束，却没有打印判定：main() 没有走到它的检查）"
  elif [ $rc -ne 0 ]; then
    # a wrong answer ends every rank with status 1 on purpose: the launcher's line about it says nothing new
    if grep -q '^hint 1: \|^提示 1：' "$out"; then grep -v '^ddp: rank [0-9]* (pid [0-9]*) exited with status 1' "$out"
    else cat "$out"; fi
    [ $rc -eq 124 ] && say "(stopped after 60 s)" "（60 秒后被停止）"
  else
    wrong=
  fi
  if [ -n "$wrong" ]; then
    say "lesson $lesson: not yet: the run with $w ranks above went wrong (exit status $rc)" \
        "第 $lesson 课：还没做对：上面用 $w 个 rank 的那次运行出了错（退出状态 $rc）"
    exit 1
  fi
done
say "lesson $lesson: correct with 1, 2, 3, 4, 5 and 7 ranks" "第 $lesson 课：正确，1、2、3、4、5、7 个 rank 都对"
