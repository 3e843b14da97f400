#!/bin/sh
# check.sh - runs a lesson's exercise (or its solution) with 3, 1, 2, 4, 5 and 7 ranks,
# then with 4 ranks on two simulated hosts, and says "correct", or shows the first run
# that went wrong with its hint. `make
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
# Two hosts of two ranks each, started as torchrun --nnodes 2 starts them, here on one:
# on the second host LOCAL_RANK is not RANK, so work shared out by local rank shows. The
# job's own id gives it a port of its own. The status: the first rank's that failed.
# shellcheck disable=SC2016 # a script for sh -c: its own shell expands it
hosts='id=lesson-$$-$(date +%s%N) pids= s=0
unset MASTER_PORT DDP_JOB_ID # (set in the calling shell, a torchrun habit, they gave every check one port)
for r in 0 1 2 3; do
  RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 GROUP_RANK=$((r / 2)) MASTER_ADDR=127.0.0.1 \
    TORCHELASTIC_RUN_ID=$id "$1" &
  pids="$pids $!"
done
for p in $pids; do wait $p; c=$?; [ $s -eq 0 ] && s=$c; done
exit $s'
for w in 3 1 2 4 5 7 hosts; do
  if [ $w = hosts ]; then
    timeout 60 sh -c "$hosts" sh "$bin" >"$out" 2>&1 &
  else
    timeout 60 "$bin" --nproc $w >"$out" 2>&1 &
  fi
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
  if [ -n "$wrong" ] && [ $w = hosts ]; then
    say "lesson $lesson: not yet: the run above, 4 ranks on two simulated hosts, went wrong (ranks 2 and 3 on the second, as its local ranks 0 and 1; exit status $rc)" \
        "第 $lesson 课：还没做对：上面在两台模拟主机上用 4 个 rank 的那次运行出了错（rank 2、3 在第二台上，是它的 local rank 0、1；退出状态 $rc）"
    exit 1
  elif [ -n "$wrong" ]; then
    say "lesson $lesson: not yet: the run with $w ranks above went wrong (exit status $rc)" \
        "第 $lesson 课：还没做对：上面用 $w 个 rank 的那次运行出了错（退出状态 $rc）"
    exit 1
  fi
done
say "lesson $lesson: correct with 1, 2, 3, 4, 5 and 7 ranks, and with 4 on two hosts" \
    "第 $lesson 课：正确，1、2、3、4、5、7 个 rank 都对，两台主机上的 4 个 rank 也对"
