#!/usr/bin/env bash
# tools/fault-campaign.sh: a fault campaign against a build (issue 48 item 6; docs/checkpoints.md,
# "The fault campaign"). It runs tz-train (and tools/tz-data) through six groups of faults and
# classifies each case:
#   ok     the documented behaviour: a clear refusal or failure (exit status as documented, a
#          message naming what was wrong), or a recovery with the uninterrupted run's numbers
#   hang   the case ran past its timeout
#   crash  killed by a signal the case did not send (or another exit status >= 128)
#   silent a bad input accepted, damaged or mixed state read without a word, a resumed loss that
#          differs from the uninterrupted run's (to the bit, as printed in --metrics), an exit
#          status other than the documented one, or a refusal whose message is empty or does
#          not name what was wrong
#   lost   trained state lost: no checkpoint after a stop request, none although every step
#          saves, or a latest that does not resume
# Groups: signals (into live runs, then --resume), checkpoint (damaged checkpoints), config (bad
# configs, flags and files), nvme (TZ_FAULTS with state on nvme), limits (ulimit -f, -v, -n),
# tz-data (bad inputs of tools/tz-data).
#
# Usage: tools/fault-campaign.sh [--bin DIR] [--quick] [--out DIR]
#   --bin DIR  the build's programs (default: build/bin of this repository)
#   --quick    one representative case per group (6 cases, 5-11 s on 2 cores); default: every
#              case (142, about 3 minutes on 2 cores)
#   --out DIR  where each case's logs go (default: a new temporary directory); kept at the end
# Prints a line per case (`group case outcome detail`) and
# `fault-campaign: N cases: ok A, hang B, crash C, silent D, lost E`; exits 0 only when every case
# is ok, 1 otherwise, 2 on a usage error.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin
quick=0
out=
while [ $# -gt 0 ]; do
  case $1 in
  --bin) bin=${2:?--bin needs a directory}; shift 2 ;;
  --bin=*) bin=${1#--bin=}; shift ;;
  --out) out=${2:?--out needs a directory}; shift 2 ;;
  --out=*) out=${1#--out=}; shift ;;
  --quick) quick=1; shift ;;
  -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "fault-campaign: unknown argument '$1' (tools/fault-campaign.sh --help)" >&2; exit 2 ;;
  esac
done
abs=$(cd "$bin" 2> /dev/null && pwd) || { echo "fault-campaign: no directory $bin" >&2; exit 2; }
bin=$abs
TZ=$bin/tz-train
[ -x "$TZ" ] || { echo "fault-campaign: no $TZ: build first (or give --bin)" >&2; exit 2; }
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/tz-fault-campaign-XXXXXX") || exit 2
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
results=$out/results.txt
: > "$results"
echo "fault-campaign: $([ $quick = 1 ] && echo quick || echo full) campaign of $TZ; logs in $out"

# Every run: one thread (2-core machines), the campaign's own rates cache (nothing written to
# ~/.cache), a line per step; no TZ_* setting of the caller leaks into the cases.
export OMP_NUM_THREADS=1
unset TZ_FAULTS TZ_LOG TZ_JITTER_US TZ_HOST_BUDGET TZ_HBM_BUDGET TZ_NVME_PATH TZ_TEST_HANG_AFTER_STEP \
  TZ_TEST_SIGTERM_AFTER_RUN 2>/dev/null
RATES=$out/rates.json
COMMON=(--rates "$RATES" --progress plain)
KILL_AFTER=5 # timeout -k: SIGKILL this long after the timeout's SIGTERM

n_ok=0 n_hang=0 n_crash=0 n_silent=0 n_lost=0
started=$SECONDS

# report GROUP CASE OUTCOME DETAIL...
report() {
  local g=$1 c=$2 o=$3
  shift 3
  local d="$*"
  d=${d//$'\n'/ }
  [ ${#d} -gt 300 ] && d="${d:0:297}..."
  printf '%s %s %s %s\n' "$g" "$c" "$o" "$d" | tee -a "$results"
  case $o in
  ok) n_ok=$((n_ok + 1)) ;;
  hang) n_hang=$((n_hang + 1)) ;;
  crash) n_crash=$((n_crash + 1)) ;;
  silent) n_silent=$((n_silent + 1)) ;;
  lost) n_lost=$((n_lost + 1)) ;;
  esac
  # a case that passed keeps its logs, not its checkpoints and nvme files
  if [ "$o" = ok ] && [ -n "${CASE_DIR:-}" ]; then
    rm -rf "$CASE_DIR"/ck "$CASE_DIR"/nv "$CASE_DIR"/d
  fi
}

# case_dir GROUP CASE: a fresh directory for the case's files, in CASE_DIR
case_dir() {
  CASE_DIR=$out/$1/$2
  rm -rf "$CASE_DIR"
  mkdir -p "$CASE_DIR"
}

sig_name() { kill -l "$1" 2>/dev/null || echo "$1"; }

# first line of a file (the error message), at most 200 characters
msg() { [ -s "$1" ] && grep -v '^libnuma: Warning' "$1" | grep -m1 . | cut -c1-200; }

# ran STATUS T0 LIMIT: RC, ELAPSED (seconds since T0) and HUNG (1 when the timeout of LIMIT
# seconds ended the run: status 124, or 137 at or past LIMIT) of a run that just ended
ran() {
  RC=$1
  ELAPSED=$(awk -v a="$2" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  HUNG=0
  if [ "$RC" = 124 ] || { [ "$RC" = 137 ] && awk -v e="$ELAPSED" -v l="$3" 'BEGIN { exit !(e >= l) }'; }; then
    HUNG=1
  fi
}

# run_to LIMIT LOG CMD...: CMD under timeout, stdout in LOG.out, stderr in LOG.err; RC its exit
# status, ELAPSED its seconds; HUNG 1 when the timeout ended it.
run_to() {
  local limit=$1 log=$2
  shift 2
  local t0=$EPOCHREALTIME
  # (the braces take the shell's "Killed" notice of a run the timeout had to kill)
  { timeout -k $KILL_AFTER "$limit" "$@" > "$log.out" 2> "$log.err" < /dev/null; } 2> /dev/null
  ran "$?" "$t0" "$limit"
}

# classify_rc SENT: hang / crash from RC and HUNG (SENT: the signal number the case sent, or 0);
# prints nothing when neither
classify_rc() {
  local sent=${1:-0}
  if [ "$HUNG" = 1 ]; then
    echo hang
  elif [ "$RC" -ge 128 ] && [ $((RC - 128)) != "$sent" ]; then
    echo crash
  fi
}

# step_losses FILE: "step loss" per step line of a --metrics file, in file order
step_losses() {
  [ -f "$1" ] || return 0
  sed -n -E 's/^\{"step":([0-9]+),.*"loss":([^,}]*)[,}].*$/\1 \2/p' "$1"
}
# final_loss FILE STEP: the loss of that step's last line
final_loss() { step_losses "$1" | awk -v s="$2" '$1 == s { l = $2 } END { if (l != "") print l }'; }

# compare_metrics FILE STRAIGHT STEPS [present]: "" when FILE has the straight run's loss for
# every step, once each (with present: for each step FILE has), else what differs
compare_metrics() {
  local f=$1 s=$2 n=$3 mode=${4:-all} a b
  a=$(final_loss "$f" "$n")
  b=$(final_loss "$s" "$n")
  if [ -z "$a" ]; then
    echo "no loss for step $n in $f"
  elif [ "$a" != "$b" ]; then
    echo "final loss $a, the uninterrupted run's $b"
  elif [ "$mode" = all ] && ! diff <(step_losses "$f") <(step_losses "$s") > /dev/null; then
    echo "final loss equal ($a) but the metrics file's steps differ from the uninterrupted run's: $(diff <(step_losses "$f") <(step_losses "$s") | grep -m2 '^[<>]' | tr '\n' ' ')"
  elif [ "$mode" = present ]; then
    local bad
    bad=$(step_losses "$f" | while read -r st lo; do
      [ "$(final_loss "$s" "$st")" = "$lo" ] || echo "step $st: $lo, the straight run's $(final_loss "$s" "$st")"
    done | head -2 | tr '\n' ' ')
    [ -n "$bad" ] && echo "$bad"
  fi
}

# ckpt_step DIR: the step number that DIR/latest names, or nothing
ckpt_step() {
  [ -f "$1/latest" ] || return 0
  sed -n -E '1s/^step-0*([0-9]+)$/\1/p' "$1/latest"
}

# leftovers DIR: the temporary directories a failed or killed save left
leftovers() { [ -d "$1" ] && find "$1" -maxdepth 1 -name '*.tmp' | tr '\n' ' '; }

# --------------------------------------------------------------------------------------------
# 1. signals into live runs
# --------------------------------------------------------------------------------------------
SIG_STEPS=24
SIG_ARGS=(--steps "$SIG_STEPS" --seq 64 --data synthetic)
SIG_LIMIT=120

# start_bg LOG CMD...: CMD under timeout in the background; TPID timeout's pid, CPID CMD's
start_bg() {
  local log=$1
  shift
  rm -f "$log.pid"
  T0=$EPOCHREALTIME
  # in a subshell that exits with timeout's status, so that the shell has no "Killed" notice of
  # its own to print when the case kills the run
  (
    timeout -k $KILL_AFTER $SIG_LIMIT bash -c 'echo $$ > "$0.pid"; exec "$@"' "$log" "$@" \
      > "$log.out" 2> "$log.err" < /dev/null
    exit $?
  ) 2> /dev/null &
  TPID=$!
  local _
  for _ in $(seq 500); do
    [ -s "$log.pid" ] && break
    sleep 0.01
  done
  CPID=$(cat "$log.pid" 2>/dev/null)
}

# wait_step FILE K: until FILE has step K's line (0: until the run has printed its model line),
# the run ends, or 60 s; 0 when reached
wait_step() {
  local f=$1 k=$2 _
  for _ in $(seq 3000); do
    if [ "$k" = 0 ]; then
      grep -q '^tz-train: model' "$LOG.out" 2> /dev/null && return 0
    else
      grep -q "^{\"step\":$k," "$f" 2> /dev/null && return 0
    fi
    kill -0 "$CPID" 2> /dev/null || return 1
    sleep 0.02
  done
  return 1
}

# finish_bg: wait for the background run; RC, ELAPSED, HUNG
finish_bg() {
  wait "$TPID" 2> /dev/null
  ran "$?" "$T0" "$SIG_LIMIT"
}

# signal_case_last NAME SIGNAL: signal_case after the last step, where the run may end (its
# checkpoint, teardown) before the signal is sent: run again, up to 5 times, until it arrives
signal_case_last() {
  local try
  for try in 1 2 3 4 5; do
    SIG_GONE=0
    signal_case "$1" "$SIG_STEPS" "$2" && return
    [ $? = 3 ] || return
  done
  report signals "$1" ok "not exercised: in 5 runs each ended before SIG$2 could be sent after its last step (tests/test_train_cli.c raises it there)"
}

# signal_case NAME K SIGNALS [EXTRA_ARGS...]: train SIG_STEPS steps saving every step, send
# SIGNALS ("TERM", "KILL", "STOP+CONT", "INT+INT", ...) after step K (0: before the first step),
# then resume until the end; the resumed run must end with the uninterrupted run's losses.
signal_case() {
  local name=$1 k=$2 sigs=$3
  shift 3
  local extra=("$@")
  case_dir signals "$name"
  local d=$CASE_DIR ck=$CASE_DIR/ck m=$CASE_DIR/m.jsonl
  LOG=$d/run
  start_bg "$LOG" "$TZ" "${SIG_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$ck" --save-every 1 --keep 2 \
    --metrics "$m" "${extra[@]}"
  local reached=1 sent=0 first late=""
  wait_step "$m" "$k" || reached=0
  if [ $reached = 0 ]; then
    late="the run had ended before step $k; "
  fi
  first=${sigs%%+*}
  case $sigs in
  STOP+CONT)
    kill -STOP "$CPID" 2> /dev/null
    sleep 1
    kill -CONT "$CPID" 2> /dev/null
    sent=0
    ;;
  INT+INT)
    kill -INT "$CPID" 2> /dev/null
    sleep 0.005
    kill -INT "$CPID" 2> /dev/null
    sent=$(kill -l INT)
    ;;
  *)
    # a run that has ended (gone, or a zombie not yet reaped by timeout) gets no signal: the
    # last step's case can lose that race, and is then run again (signal_case_last)
    if [ "$(awk '{ print $3 }' "/proc/$CPID/stat" 2> /dev/null)" != Z ] &&
      kill -"$first" "$CPID" 2> /dev/null; then
      sent=$(kill -l "$first")
    else
      SIG_GONE=1
    fi
    ;;
  esac
  finish_bg
  if [ "${SIG_GONE:-0}" = 1 ] && [ "$k" = "$SIG_STEPS" ]; then
    return 3
  fi
  local rc1=$RC o
  o=$(classify_rc "$sent")
  if [ -n "$o" ]; then
    report signals "$name" "$o" "${late}exit $rc1 after SIG$sigs (elapsed ${ELAPSED}s): $(msg "$LOG.err")"
    return
  fi
  local saved
  saved=$(ckpt_step "$ck")
  local steps_done
  steps_done=$(step_losses "$m" | awk 'END { print $1 + 0 }')
  local why=""
  # what the documentation promises for each signal
  case $sigs in
  TERM | INT)
    local what=Terminated
    [ "$sigs" = INT ] && what=Interrupt
    if [ $rc1 = 0 ] && [ "$steps_done" = $SIG_STEPS ]; then
      if [ $reached = 1 ] && [ "$k" = $SIG_STEPS ]; then
        if ! grep -q "arrived after the last step; the run had completed (exit 0)" "$LOG.err"; then
          report signals "$name" silent "SIG$sigs after the last step: exit 0 without the documented 'arrived after the last step' line"
          return
        fi
        why="exit 0: '$(grep -m1 'arrived after the last step' "$LOG.err")'; "
      fi
    elif [ $rc1 -ge 128 ] && [ "$k" = 0 ] && [ "$steps_done" = 0 ]; then
      why="died by SIG$(sig_name $((rc1 - 128))) before its first step (before the handlers are installed): nothing to lose; "
    elif [ $rc1 -ge 128 ]; then
      report signals "$name" lost "SIG$sigs not honoured: the run died by SIG$(sig_name $((rc1 - 128))) instead of saving and exiting 1 (checkpoint ${saved:-none})"
      return
    elif [ $rc1 != 1 ]; then
      report signals "$name" silent "SIG$sigs: exit $rc1, not the documented 1: $(msg "$LOG.err")"
      return
    else
      local line
      line=$(grep -m1 "stopped by $what after step" "$LOG.err")
      if [ -z "$line" ]; then
        report signals "$name" silent "SIG$sigs: exit 1 without 'stopped by $what after step N; checkpoint saved': $(msg "$LOG.err")"
        return
      fi
      local at
      at=$(sed -E 's/.*after step ([0-9]+).*/\1/' <<< "$line")
      if ! grep -q "checkpoint saved" <<< "$line" || [ "$saved" != "$at" ]; then
        report signals "$name" lost "SIG$sigs: stopped after step $at but latest is ${saved:-missing}: $line"
        return
      fi
      why="stopped after step $at, exit 1, latest step $saved; "
    fi
    ;;
  KILL | HUP | INT+INT)
    if [ $rc1 = 0 ]; then
      why="completed before the signal; "
    else
      if [ -z "$saved" ] && [ "$steps_done" -ge 2 ]; then
        report signals "$name" lost "SIG$sigs after step $steps_done (exit $rc1): no checkpoint although every step saves"
        return
      fi
      why="exit $rc1 after step $steps_done, latest ${saved:-none}; "
    fi
    ;;
  STOP+CONT)
    if [ $rc1 != 0 ]; then
      report signals "$name" lost "SIGSTOP, 1 s, SIGCONT: exit $rc1 instead of completing: $(msg "$LOG.err")"
      return
    fi
    why="stopped 1 s, completed; "
    ;;
  esac
  local left
  left=$(leftovers "$ck")
  [ -n "$left" ] && why="${why}the killed save left ${left//$ck\//}; "
  if [ $rc1 = 0 ] && [ "$saved" != $SIG_STEPS ]; then
    report signals "$name" lost "${why}exit 0, but latest is ${saved:-missing}, not step $SIG_STEPS"
    return
  elif [ $rc1 = 0 ] || { [ "$steps_done" = $SIG_STEPS ] && [ "$saved" = $SIG_STEPS ]; }; then
    :
  else
    # resume until the end, as a requeued job does
    run_to $SIG_LIMIT "$d/resume" "$TZ" "${SIG_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$ck" --resume auto \
      --save-every 1 --keep 2 --metrics "$m" "${extra[@]}"
    o=$(classify_rc 0)
    if [ -n "$o" ]; then
      report signals "$name" "$o" "${why}the resume: exit $RC: $(msg "$d/resume.err")"
      return
    fi
    if [ $RC != 0 ]; then
      report signals "$name" lost "${why}the resume failed, exit $RC: $(msg "$d/resume.err")"
      return
    fi
    why="${why}resumed from ${saved:-the start}; "
  fi
  local diff
  diff=$(compare_metrics "$m" "$STRAIGHT" $SIG_STEPS)
  left=$(leftovers "$ck")
  if [ -n "$diff" ]; then
    report signals "$name" silent "${late}${why}$diff"
  else
    report signals "$name" ok "${late}${why}losses equal the uninterrupted run's (final $(final_loss "$m" $SIG_STEPS))${left:+; still left at the end: $left}"
  fi
}

# term_twice: SIGTERM, resume, SIGTERM into the resumed run, resume again
term_twice() {
  case_dir signals term-resumed-term
  local d=$CASE_DIR ck=$CASE_DIR/ck m=$CASE_DIR/m.jsonl r
  for r in 1 2; do
    LOG=$d/run$r
    local res=()
    [ $r = 2 ] && res=(--resume auto)
    start_bg "$LOG" "$TZ" "${SIG_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$ck" --save-every 1 --keep 2 \
      --metrics "$m" "${res[@]}"
    wait_step "$m" $((r * 4))
    kill -TERM "$CPID" 2> /dev/null
    finish_bg
    local o
    o=$(classify_rc "$(kill -l TERM)")
    if [ -n "$o" ]; then
      report signals term-resumed-term "$o" "run $r: exit $RC: $(msg "$LOG.err")"
      return
    fi
    if [ $RC != 1 ] || ! grep -q "checkpoint saved" "$LOG.err"; then
      report signals term-resumed-term lost "run $r: exit $RC without a saved checkpoint: $(msg "$LOG.err")"
      return
    fi
  done
  run_to $SIG_LIMIT "$d/resume" "$TZ" "${SIG_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$ck" --resume auto \
    --save-every 1 --keep 2 --metrics "$m"
  if [ $RC != 0 ]; then
    report signals term-resumed-term "$(classify_rc 0 | grep . || echo lost)" "the last resume: exit $RC: $(msg "$d/resume.err")"
    return
  fi
  local diff
  diff=$(compare_metrics "$m" "$STRAIGHT" $SIG_STEPS)
  if [ -n "$diff" ]; then
    report signals term-resumed-term silent "$diff"
  else
    report signals term-resumed-term ok "stopped twice, resumed twice: losses equal the uninterrupted run's"
  fi
}

group_signals() {
  mkdir -p "$out/signals"
  STRAIGHT=$out/signals/straight.jsonl
  run_to $SIG_LIMIT "$out/signals/straight" "$TZ" "${SIG_ARGS[@]}" "${COMMON[@]}" --metrics "$STRAIGHT"
  if [ $RC != 0 ] || [ -z "$(final_loss "$STRAIGHT" $SIG_STEPS)" ]; then
    report signals straight-run "$(classify_rc 0 | grep . || echo lost)" "the uninterrupted run failed, exit $RC: $(msg "$out/signals/straight.err")"
    return
  fi
  if [ $quick = 1 ]; then
    signal_case term@3 3 TERM
    return
  fi
  local k
  for k in 1 4 9; do signal_case "kill@$k" $k KILL; done
  for k in 2 6; do signal_case "term@$k" $k TERM; done
  for k in 3 7; do signal_case "int@$k" $k INT; done
  signal_case int-twice@4 4 INT+INT
  for k in 2 5; do signal_case "hup@$k" $k HUP; done
  for k in 3 8; do signal_case "stop-cont@$k" $k STOP+CONT; done
  signal_case term-before-step1 0 TERM
  signal_case_last term-at-last-step TERM
  term_twice
  # the same with every kind of state on nvme files (the save reads the shards from them)
  mkdir -p "$out/signals/nv"
  printf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}, "offload_param": {"device": "nvme", "nvme_path": "%s"}}}\n' \
    "$out/signals/nv" "$out/signals/nv" > "$out/signals/nvme.json"
  signal_case term-nvme@3 3 TERM --config "$out/signals/nvme.json"
  signal_case kill-nvme@5 5 KILL --config "$out/signals/nvme.json"
}

# --------------------------------------------------------------------------------------------
# 2. damaged checkpoints
# --------------------------------------------------------------------------------------------
CK_ARGS=(--seq 16 --data synthetic)

# flip FILE OFFSET: one byte of FILE xor 0xa5
flip() {
  local f=$1 off=$2 b
  b=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
  printf "\\$(printf '%03o' $(((b ^ 0xa5) & 0xff)))" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
}

# damage_case NAME NAMES DAMAGE...: a copy of the base checkpoints (steps 3 and 4, latest 4),
# DAMAGE run in it, then --resume to step 6; refused with exit 1 or 2 and a message holding NAMES
# (a regex), or accepted with the straight run's losses
damage_case() {
  local name=$1 names=$2
  shift 2
  case_dir checkpoint "$name"
  local d=$CASE_DIR/d
  mkdir -p "$d"
  cp -a "$CK_BASE/step-00000003" "$CK_BASE/step-00000004" "$CK_BASE/latest" "$d/"
  (cd "$d" && eval "$*") > "$CASE_DIR/damage.log" 2>&1
  local before
  before=$(cd "$d" && find . -type f ! -name .lock -exec cksum {} + | sort)
  run_to 60 "$CASE_DIR/resume" "$TZ" --steps 6 "${CK_ARGS[@]}" "${COMMON[@]}" --resume "$d" \
    --metrics "$CASE_DIR/m.jsonl"
  local o
  o=$(classify_rc 0)
  if [ -n "$o" ]; then
    report checkpoint "$name" "$o" "exit $RC: $(msg "$CASE_DIR/resume.err")"
    return
  fi
  if [ $RC = 0 ]; then
    local diff
    diff=$(compare_metrics "$CASE_DIR/m.jsonl" "$CK_STRAIGHT" 6 present)
    if [ -n "$diff" ]; then
      report checkpoint "$name" silent "damaged checkpoint accepted: $diff"
    else
      report checkpoint "$name" ok "accepted: the damaged byte holds no state (losses equal the straight run's to the bit)"
    fi
    return
  fi
  local m full
  full=$(grep -m1 'tz-train' "$CASE_DIR/resume.err")
  m=$(cut -c1-220 <<< "$full")
  if [ $RC != 1 ] && [ $RC != 2 ]; then
    report checkpoint "$name" silent "exit $RC, not a documented status (1 or 2): $m"
  elif [ -z "$m" ]; then
    report checkpoint "$name" silent "refused (exit $RC) without a message"
  elif ! grep -Eq "$names" <<< "$full"; then
    report checkpoint "$name" silent "refused (exit $RC), but the message does not name $names: $m"
  elif [ "$before" != "$(cd "$d" && find . -type f ! -name .lock -exec cksum {} + | sort)" ]; then
    report checkpoint "$name" silent "refused (exit $RC), but the refused resume changed the checkpoint directory: $m"
  else
    report checkpoint "$name" ok "exit $RC: $m"
  fi
}

group_checkpoint() {
  mkdir -p "$out/checkpoint"
  CK_BASE=$out/checkpoint/base
  CK_STRAIGHT=$out/checkpoint/straight6.jsonl
  rm -rf "$CK_BASE"
  run_to 60 "$out/checkpoint/base" "$TZ" --steps 4 "${CK_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$CK_BASE" \
    --save-every 1 --metrics "$out/checkpoint/base.jsonl"
  local rc1=$RC
  run_to 60 "$out/checkpoint/straight6" "$TZ" --steps 6 "${CK_ARGS[@]}" "${COMMON[@]}" --metrics "$CK_STRAIGHT"
  if [ $rc1 != 0 ] || [ $RC != 0 ] || [ "$(ckpt_step "$CK_BASE")" != 4 ]; then
    report checkpoint base-runs lost "the runs that make the checkpoints failed (exit $rc1, $RC): $(msg "$out/checkpoint/base.err")"
    return
  fi
  local R=step-00000004/rank-00000.bin M=step-00000004/manifest
  local size idx
  size=$(stat -c %s "$CK_BASE/$R")
  idx=$(od -An -tu8 -j $((size - 56)) -N8 "$CK_BASE/$R" | tr -d ' ')
  if [ $quick = 1 ]; then
    damage_case flip-payload rank-00000.bin "flip $R $((size / 2))"
  else
    damage_cases "$R" "$M" "$size" "$idx"
  fi
  rm -rf "$CK_BASE"
}

# damage_cases RANK_FILE MANIFEST SIZE INDEX_OFFSET: every damage of the full campaign
damage_cases() {
  local R=$1 M=$2 size=$3 idx=$4
  damage_case flip-header-magic rank-00000.bin "flip $R 3"
  damage_case flip-header-step rank-00000.bin "flip $R 24"
  damage_case flip-header-padding rank-00000.bin "flip $R 100"
  damage_case flip-config rank-00000.bin "flip $R 4200"
  damage_case flip-state rank-00000.bin "flip $R 8200"
  damage_case flip-payload rank-00000.bin "flip $R $((size / 2))"
  damage_case flip-last-payload rank-00000.bin "flip $R $((idx - 4096))"
  damage_case flip-index rank-00000.bin "flip $R $((idx + 4))"
  damage_case flip-trailer rank-00000.bin "flip $R $((size - 20))"
  damage_case flip-manifest-line1 manifest "flip $M 4"
  damage_case flip-manifest-json manifest "flip $M 60"
  damage_case truncate-half rank-00000.bin "truncate -s $((size / 2)) $R"
  damage_case truncate-zero rank-00000.bin "truncate -s 0 $R"
  damage_case truncate-last-byte rank-00000.bin "truncate -s $((size - 1)) $R"
  damage_case append-byte rank-00000.bin "printf x >> $R"
  damage_case truncate-manifest manifest "truncate -s 40 $M"
  damage_case remove-rank-file rank-00000.bin "rm $R"
  damage_case remove-manifest manifest "rm $M"
  damage_case remove-step-dir "step-00000004" "rm -r step-00000004"
  damage_case rank-file-of-step3 rank-00000.bin "cp step-00000003/rank-00000.bin $R"
  damage_case manifest-of-step3 manifest "cp step-00000003/manifest $M"
  damage_case latest-garbage latest "echo garbage > latest"
  damage_case latest-binary latest "head -c 64 $R > latest"
  damage_case latest-empty latest ": > latest"
  damage_case latest-names-tmp 'latest|step-00000004\.tmp' "mv step-00000004 step-00000004.tmp; echo step-00000004.tmp > latest"
  damage_case latest-dir latest "rm latest; mkdir latest"
}

# --------------------------------------------------------------------------------------------
# 3. bad configs, flags and files
# --------------------------------------------------------------------------------------------
# refuse_case NAME CODES NAMES ARGS...: tz-train ARGS (run in the case directory, whose files
# the case has made) must be refused, exit status one of CODES (e.g. "2" or "1|2"), the message
# holding NAMES (a regex), within 30 s
refuse_case() {
  local name=$1 codes=$2 names=$3
  shift 3
  run_to 30 "$CASE_DIR/run" "$TZ" "$@"
  local o m
  o=$(classify_rc 0)
  m=$(msg "$CASE_DIR/run.err")
  if [ -n "$o" ]; then
    report config "$name" "$o" "exit $RC after ${ELAPSED}s: ${m:-no message}"
  elif [ $RC = 0 ]; then
    report config "$name" silent "accepted (exit 0): ${m:-no message}"
  elif ! grep -Eqx "$codes" <<< "$RC"; then
    report config "$name" silent "exit $RC, the documented status is $codes: $m"
  elif [ -z "$m" ]; then
    report config "$name" silent "exit $RC without a message"
  elif ! grep -Eq -- "$names" "$CASE_DIR/run.err"; then
    report config "$name" silent "exit $RC, the message does not name $names: $m"
  else
    report config "$name" ok "exit $RC: $m"
  fi
}

# cfg_case NAME CODES NAMES JSON: --config of that text
cfg_case() {
  case_dir config "$1"
  printf '%b' "$4" > "$CASE_DIR/$1.json"
  in_case refuse_case "$1" "$2" "$3" --config "$1.json" --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
}

# in_case CMD...: CMD run in CASE_DIR (not in a subshell: the counts are the script's)
in_case() {
  pushd "$CASE_DIR" > /dev/null || return
  "$@"
  popd > /dev/null || true
}

# flag_case NAME CODES NAMES ARGS...
flag_case() {
  local n=$1
  case_dir config "$n"
  shift
  in_case refuse_case "$n" "$@"
}

# accept_named_case NAME KEY JSON: a config key tierzero does not know is accepted (docs/config.md)
# but named in the output
accept_named_case() {
  case_dir config "$1"
  printf '%b' "$3" > "$CASE_DIR/$1.json"
  run_to 30 "$CASE_DIR/run" "$TZ" --config "$CASE_DIR/$1.json" --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  local o
  o=$(classify_rc 0)
  if [ -n "$o" ]; then
    report config "$1" "$o" "exit $RC: $(msg "$CASE_DIR/run.err")"
  elif [ $RC != 0 ]; then
    report config "$1" silent "refused (exit $RC), docs/config.md says such a key is accepted and named: $(msg "$CASE_DIR/run.err")"
  elif ! grep -q -- "$2" "$CASE_DIR/run.out" "$CASE_DIR/run.err"; then
    report config "$1" silent "accepted without naming $2"
  else
    report config "$1" ok "accepted as documented, named: $(grep -h -m1 -- "$2" "$CASE_DIR/run.err" "$CASE_DIR/run.out" | head -1 | cut -c1-160)"
  fi
}

group_config() {
  mkdir -p "$out/config"
  if [ $quick = 1 ]; then
    case_dir config fifo-config
    mkfifo "$CASE_DIR/fifo"
    in_case refuse_case fifo-config 2 'fifo' --config fifo --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
    return
  fi
  # ds_config JSON: exit 2, the message naming the file and the key
  cfg_case wrong-type 2 'train_micro_batch_size_per_gpu' '{"train_micro_batch_size_per_gpu": "two"}'
  cfg_case wrong-type-bool 2 'fp16.enabled' '{"fp16": {"enabled": "yes"}}'
  cfg_case negative-batch 2 'train_batch_size' '{"train_batch_size": -4}'
  cfg_case negative-size 2 'tierzero.staging_bytes' '{"tierzero": {"staging_bytes": -1}}'
  cfg_case negative-chunk 2 'tierzero.chunk_bytes' '{"tierzero": {"chunk_bytes": -4096}}'
  cfg_case negative-budget 2 'tierzero.host_budget' '{"tierzero": {"host_budget": "-1GiB"}}'
  cfg_case negative-lr 2 'optimizer.params.lr' '{"optimizer": {"type": "AdamW", "params": {"lr": -1}}}'
  cfg_case zero-buffers 2 'buffer_count' '{"zero_optimization": {"offload_param": {"buffer_count": 0}}}'
  cfg_case bad-enum 2 'optimizer.type' '{"optimizer": {"type": "Adamax"}}'
  cfg_case bad-faults 2 'tierzero.faults' '{"tierzero": {"faults": "eio@0"}}'
  cfg_case syntax-error 2 'syntax-error.json:1:' '{"train_batch_size": 4,}'
  cfg_case empty-file 2 'empty-file.json' ''
  cfg_case top-level-array 2 'top-level-array.json' '[1, 2]'
  cfg_case duplicate-key 2 'duplicate' '{"seed": 1, "seed": 2}'
  cfg_case nul-byte 2 'nul-byte.json' '{"seed": 1}\0garbage'
  cfg_case huge-integer 2 'huge-integer.json' '{"seed": 99999999999999999999999}'
  cfg_case invalid-utf8 2 'invalid-utf8.json' '{"tierzero": {"nvme_path": "\xff\xfe"}}'
  cfg_case fp16-and-bf16 2 'fp16.enabled and bf16.enabled' '{"fp16": {"enabled": true}, "bf16": {"enabled": true}}'
  cfg_case batch-mismatch 2 'train_batch_size' '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}'
  accept_named_case unknown-key bogus_key '{"bogus_key": 1}'
  accept_named_case misspelt-key offload_parm '{"zero_optimization": {"offload_parm": {"device": "cpu"}}}'
  # flags: exit 2
  flag_case unknown-flag 2 "--bogus" --bogus
  flag_case steps-negative 2 "--steps" --steps -1 "${COMMON[@]}"
  flag_case steps-text 2 "--steps" --steps x "${COMMON[@]}"
  flag_case steps-huge 2 "--steps" --steps 99999999999999999999999 "${COMMON[@]}"
  flag_case steps-no-value 2 "--steps" --steps
  flag_case seq-zero 2 "--seq" --seq 0 "${COMMON[@]}"
  flag_case seq-too-long 2 "100000" --steps 1 --seq 100000 --data synthetic "${COMMON[@]}"
  flag_case set-no-equals 2 "noequals" --set noequals "${COMMON[@]}"
  flag_case set-bad-value 2 "seed" --set seed=abc "${COMMON[@]}"
  flag_case set-unknown-model 2 "nonesuch" --model nonesuch "${COMMON[@]}"
  flag_case resume-auto-without-dir 2 "--ckpt-dir" --resume auto --steps 2 "${COMMON[@]}"
  flag_case trace-step-alone 2 "--trace" --trace-step 1 --steps 2 "${COMMON[@]}"
  # files that are no files: refused at once, never waited on
  case_dir config fifo-config
  mkfifo "$CASE_DIR/fifo"
  in_case refuse_case fifo-config 2 'fifo' --config fifo --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config fifo-model
  mkfifo "$CASE_DIR/fifo"
  in_case refuse_case fifo-model 2 'fifo' --model fifo --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  # data: a failure while running (docs/training.md: exit 1 for a data file missing or malformed)
  case_dir config fifo-data
  mkfifo "$CASE_DIR/fifo"
  in_case refuse_case fifo-data 1 'fifo' --data fifo --steps 1 --seq 16 "${COMMON[@]}"
  case_dir config fifo-metrics
  mkfifo "$CASE_DIR/fifo"
  in_case refuse_case fifo-metrics '1|2' 'fifo' --metrics fifo --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config fifo-trace
  mkfifo "$CASE_DIR/fifo"
  in_case refuse_case fifo-trace '1|2' 'fifo' --trace-step 1 --trace fifo --steps 2 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config dir-config
  mkdir "$CASE_DIR/adir"
  in_case refuse_case dir-config 2 'adir' --config adir --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config dir-data
  mkdir "$CASE_DIR/adir"
  in_case refuse_case dir-data 1 'adir' --data adir --steps 1 --seq 16 "${COMMON[@]}"
  case_dir config dir-text-data
  mkdir "$CASE_DIR/adir"
  in_case refuse_case dir-text-data 1 'adir' --data text:adir --steps 1 --seq 16 "${COMMON[@]}"
  case_dir config dir-metrics
  mkdir "$CASE_DIR/adir"
  in_case refuse_case dir-metrics '1|2' 'adir' --metrics adir --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config dir-model-without-config
  mkdir "$CASE_DIR/adir"
  in_case refuse_case dir-model-without-config '1|2' 'adir' --model adir --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config file-as-ckpt-dir
  echo x > "$CASE_DIR/afile"
  in_case refuse_case file-as-ckpt-dir '1|2' 'afile' --ckpt-dir afile --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config file-as-export-dir
  echo x > "$CASE_DIR/afile"
  in_case refuse_case file-as-export-dir '1|2' 'afile' --export-safetensors afile --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
  case_dir config resume-empty-dir
  mkdir "$CASE_DIR/adir"
  in_case refuse_case resume-empty-dir '1|2' 'adir' --resume adir --steps 1 "${CK_ARGS[@]}" "${COMMON[@]}"
}

# --------------------------------------------------------------------------------------------
# 4. injected nvme faults
# --------------------------------------------------------------------------------------------
NV_ARGS=(--steps 4 --seq 16 --data synthetic)

# nvme_case NAME FAULTS [ckpt]: a run with every kind of state on nvme files and TZ_FAULTS;
# fails with a message (exit 1, an I/O error) or recovers with the fault-free run's losses; with
# ckpt it saves every step too: no save left half done, and what latest names resumes (without
# faults) to the fault-free losses
nvme_case() {
  local name=$1 faults=$2 ck=${3:-}
  case_dir nvme "$name"
  mkdir -p "$CASE_DIR/nv"
  printf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}, "offload_param": {"device": "nvme", "nvme_path": "%s"}}}\n' \
    "$CASE_DIR/nv" "$CASE_DIR/nv" > "$CASE_DIR/nvme.json"
  local cka=()
  [ -n "$ck" ] && cka=(--ckpt-dir "$CASE_DIR/ck" --save-every 1)
  TZ_FAULTS=$faults TZ_LOG=info run_to 60 "$CASE_DIR/run" "$TZ" --config "$CASE_DIR/nvme.json" "${NV_ARGS[@]}" \
    "${COMMON[@]}" --metrics "$CASE_DIR/m.jsonl" "${cka[@]}"
  local o inj
  o=$(classify_rc 0)
  inj=$(grep -h -o -e 'injected [a-z-]* [0-9]* times' -e '[1-9][0-9]* requests resubmitted after a short transfer' \
    -e '[1-9][0-9]* retried after -EAGAIN' "$CASE_DIR/run.err" | paste -sd, -)
  local left
  left=$(ls "$CASE_DIR/nv" 2> /dev/null | tr '\n' ' ')
  left=${left:+; nvme files left: $left}
  if [ -n "$o" ]; then
    report nvme "$name" "$o" "TZ_FAULTS=$faults: exit $RC after ${ELAPSED}s: $(msg "$CASE_DIR/run.err")"
    return
  fi
  if [ $RC = 0 ]; then
    local diff
    diff=$(compare_metrics "$CASE_DIR/m.jsonl" "$NV_STRAIGHT" 4)
    if [ -n "$diff" ]; then
      report nvme "$name" silent "TZ_FAULTS=$faults: completed (${inj:-nothing injected}) but $diff"
    else
      report nvme "$name" ok "TZ_FAULTS=$faults: recovered (${inj:-nothing injected}), losses equal the fault-free run's$left"
    fi
    return
  fi
  local m
  m=$(grep -m1 '^tz-train: rank' "$CASE_DIR/run.err" | cut -c1-200)
  if [ $RC != 1 ]; then
    report nvme "$name" silent "TZ_FAULTS=$faults: exit $RC, the documented status of an I/O error is 1: ${m:-$(msg "$CASE_DIR/run.err")}"
    return
  elif [ -z "$m" ]; then
    report nvme "$name" silent "TZ_FAULTS=$faults: exit 1 without tz-train's message"
    return
  fi
  if [ -n "$ck" ]; then
    local tmp saved
    tmp=$(leftovers "$CASE_DIR/ck")
    saved=$(ckpt_step "$CASE_DIR/ck")
    if [ -n "$tmp" ]; then
      report nvme "$name" silent "TZ_FAULTS=$faults: exit 1, a failed save left $tmp: $m"
      return
    fi
    if [ -n "$saved" ]; then
      run_to 60 "$CASE_DIR/resume" "$TZ" --config "$CASE_DIR/nvme.json" "${NV_ARGS[@]}" "${COMMON[@]}" \
        --resume "$CASE_DIR/ck" --metrics "$CASE_DIR/m.jsonl"
      if [ $RC != 0 ]; then
        report nvme "$name" "$(classify_rc 0 | grep . || echo lost)" "TZ_FAULTS=$faults: failed (exit 1: $m), and latest (step $saved) does not resume: exit $RC: $(msg "$CASE_DIR/resume.err")"
        return
      fi
      local diff
      diff=$(compare_metrics "$CASE_DIR/m.jsonl" "$NV_STRAIGHT" 4)
      if [ -n "$diff" ]; then
        report nvme "$name" silent "TZ_FAULTS=$faults: failed, latest step $saved resumed: $diff"
        return
      fi
      inj="$inj; latest (step $saved) resumes to the fault-free losses"
    else
      inj="$inj; no checkpoint yet"
    fi
  fi
  report nvme "$name" ok "TZ_FAULTS=$faults: exit 1 (${inj:-}): $m$left"
}

group_nvme() {
  mkdir -p "$out/nvme/straight/nv"
  NV_STRAIGHT=$out/nvme/straight/m.jsonl
  printf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}, "offload_param": {"device": "nvme", "nvme_path": "%s"}}}\n' \
    "$out/nvme/straight/nv" "$out/nvme/straight/nv" > "$out/nvme/straight/nvme.json"
  run_to 120 "$out/nvme/straight/run" "$TZ" --config "$out/nvme/straight/nvme.json" "${NV_ARGS[@]}" "${COMMON[@]}" \
    --metrics "$NV_STRAIGHT"
  if [ $RC != 0 ]; then
    report nvme fault-free-run "$(classify_rc 0 | grep . || echo lost)" "the run without faults failed, exit $RC: $(msg "$out/nvme/straight/run.err")"
    return
  fi
  if [ $quick = 1 ]; then
    nvme_case eio@50 eio@50
    return
  fi
  nvme_case eio@1 eio@1
  nvme_case eio@5 eio@5
  nvme_case eio@50 eio@50
  nvme_case eio-read@30 eio-read@30
  nvme_case eio-write@20 eio-write@20
  nvme_case enospc@3 enospc@3
  nvme_case enospc@60 enospc@60
  nvme_case flip@10 flip@10
  nvme_case flip@40 flip@40
  nvme_case flip@100 flip@100
  nvme_case short@2 short@2
  nvme_case short%30 'short%30,seed=5'
  nvme_case nvme-short nvme-short@1,nvme-short@7
  nvme_case nvme-eagain nvme-eagain@1,nvme-eagain@5
  nvme_case delay delay=20000
  nvme_case eio%5 'eio%5,seed=3'
  # saving every step: the save reads each shard back from nvme (on this build, operation 160 is
  # such a read during the save of step 2; 240 a read of step 4)
  nvme_case eio-read@160-ckpt eio-read@160 ckpt
  nvme_case flip@160-ckpt flip@160 ckpt
  nvme_case eio-read@240-ckpt eio-read@240 ckpt
  nvme_case enospc%10-ckpt 'enospc%10,seed=2' ckpt
  nvme_case eio%1-ckpt 'eio%1,seed=7' ckpt
  nvme_case flip%2-ckpt 'flip%2,seed=11' ckpt
}

# --------------------------------------------------------------------------------------------
# 5. resource limits
# --------------------------------------------------------------------------------------------
# limited LIMIT LOG ULIMIT_ARGS -- CMD...: CMD under that ulimit and timeout (the shell that sets
# the limit is replaced by timeout, so the script's own commands keep their descriptors)
limited() {
  local limit=$1 log=$2 ul=$3
  shift 4
  local t0=$EPOCHREALTIME
  { bash -c 'ulimit '"$ul"' || exit 99; exec timeout -k '$KILL_AFTER' "$@"' limited "$limit" "$@" \
    > "$log.out" 2> "$log.err" < /dev/null; } 2> /dev/null
  ran "$?" "$t0" "$limit"
}

# fsize_case NAME KIB RESUMED: a run saving every step under ulimit -f KIB: the save (or the
# metrics file) fails naming the file, exit 1, no .tmp left; RESUMED 1: a run resumed from an
# intact checkpoint, which must stay latest and be called intact
fsize_case() {
  local name=$1 kib=$2 resumed=$3
  case_dir limits "$name"
  local ck=$CASE_DIR/ck res=()
  if [ "$resumed" = 1 ]; then
    run_to 60 "$CASE_DIR/first" "$TZ" --steps 2 "${CK_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$ck" --save-every 1
    res=(--resume "$ck")
  fi
  limited 60 "$CASE_DIR/run" "-f $kib" -- "$TZ" --steps 4 "${CK_ARGS[@]}" "${COMMON[@]}" --ckpt-dir "$ck" \
    --save-every 1 --metrics "$CASE_DIR/m.jsonl" "${res[@]}"
  local o m full tmp saved
  o=$(classify_rc 0)
  full=$(grep -m1 '^tz-train: rank' "$CASE_DIR/run.err")
  m=$(cut -c1-260 <<< "$full")
  tmp=$(leftovers "$ck")
  saved=$(ckpt_step "$ck")
  if [ -n "$o" ]; then
    report limits "$name" "$o" "ulimit -f $kib: exit $RC: $(msg "$CASE_DIR/run.err")"
  elif [ $RC = 0 ]; then
    report limits "$name" silent "ulimit -f $kib: exit 0, a checkpoint of 13 MB saved past the limit?"
  elif [ $RC != 1 ] || [ -z "$m" ]; then
    report limits "$name" silent "ulimit -f $kib: exit $RC: ${m:-no message}"
  elif ! grep -Eq 'rank-00000\.bin|m\.jsonl' <<< "$full" || ! grep -q 'File too large' <<< "$full"; then
    report limits "$name" silent "ulimit -f $kib: the message does not name the file and EFBIG: $m"
  elif [ -n "$tmp" ]; then
    report limits "$name" silent "ulimit -f $kib: the failed save left $tmp: $m"
  elif [ "$resumed" = 1 ] && { [ "$saved" != 2 ] || ! grep -q 'latest still names step-00000002.*intact' <<< "$full"; }; then
    report limits "$name" lost "ulimit -f $kib: latest is ${saved:-missing}, not the intact step 2, or the message does not say so: $m"
  else
    report limits "$name" ok "ulimit -f $kib: exit 1: $m"
  fi
}

# vmem_case KIB: a run under ulimit -v KIB with the machine's threads (OMP_NUM_THREADS unset):
# it runs, or it is refused or fails saying why; never a hang
vmem_case() {
  local kib=$1
  case_dir limits "vmem-$kib"
  limited 60 "$CASE_DIR/run" "-v $kib" -- env -u OMP_NUM_THREADS "$TZ" --steps 2 "${CK_ARGS[@]}" "${COMMON[@]}" \
    --metrics "$CASE_DIR/m.jsonl"
  local o m
  o=$(classify_rc 0)
  m=$(grep -m1 '^tz-train: rank\|^tz-train: .*ulimit\|Cannot allocate' "$CASE_DIR/run.err" | cut -c1-220)
  if [ -n "$o" ]; then
    report limits "vmem-$kib" "$o" "ulimit -v $kib: exit $RC after ${ELAPSED}s: $(msg "$CASE_DIR/run.err")"
  elif [ $RC = 0 ]; then
    report limits "vmem-$kib" ok "ulimit -v $kib: ran (${ELAPSED}s)"
  elif [ -z "$m" ]; then
    report limits "vmem-$kib" silent "ulimit -v $kib: exit $RC without saying why: $(msg "$CASE_DIR/run.err")"
  else
    report limits "vmem-$kib" ok "ulimit -v $kib: exit $RC (${ELAPSED}s): $m"
  fi
}

# nofile_case N: ulimit -n N with state on nvme and a checkpoint every step: runs with the
# fault-free losses, or fails saying why; nothing half saved
nofile_case() {
  local n=$1
  case_dir limits "nofile-$n"
  mkdir -p "$CASE_DIR/nv"
  printf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}, "offload_param": {"device": "nvme", "nvme_path": "%s"}}}\n' \
    "$CASE_DIR/nv" "$CASE_DIR/nv" > "$CASE_DIR/nvme.json"
  limited 60 "$CASE_DIR/run" "-n $n" -- "$TZ" --config "$CASE_DIR/nvme.json" "${NV_ARGS[@]}" "${COMMON[@]}" \
    --ckpt-dir "$CASE_DIR/ck" --save-every 1 --metrics "$CASE_DIR/m.jsonl"
  local o m tmp
  o=$(classify_rc 0)
  m=$(grep -m1 '^tz-train: rank\|^tz-train: [^ ]*: ' "$CASE_DIR/run.err" | cut -c1-220)
  tmp=$(leftovers "$CASE_DIR/ck")
  if [ -n "$o" ]; then
    report limits "nofile-$n" "$o" "ulimit -n $n: exit $RC: $(msg "$CASE_DIR/run.err")"
  elif [ -n "$tmp" ]; then
    report limits "nofile-$n" silent "ulimit -n $n: exit $RC, a save left $tmp"
  elif [ $RC = 0 ]; then
    local diff
    diff=$(compare_metrics "$CASE_DIR/m.jsonl" "$NV_STRAIGHT" 4)
    if [ -n "$diff" ]; then
      report limits "nofile-$n" silent "ulimit -n $n: ran, but $diff"
    else
      report limits "nofile-$n" ok "ulimit -n $n: ran, losses equal the run without limits"
    fi
  elif [ -z "$m" ]; then
    report limits "nofile-$n" silent "ulimit -n $n: exit $RC without saying why: $(msg "$CASE_DIR/run.err")"
  else
    report limits "nofile-$n" ok "ulimit -n $n: exit $RC: $m"
  fi
}

group_limits() {
  mkdir -p "$out/limits"
  if [ $quick = 1 ]; then
    fsize_case fsize-4096 4096 0
    return
  fi
  fsize_case fsize-1 1 0
  fsize_case fsize-8 8 0
  fsize_case fsize-4096 4096 0
  fsize_case fsize-4096-resumed 4096 1
  local v
  for v in 400000 800000 1000000 1300000 1500000 1700000 2500000; do vmem_case $v; done
  if [ -z "${NV_STRAIGHT:-}" ] || [ ! -s "$NV_STRAIGHT" ]; then
    echo "fault-campaign: limits: the nofile cases need the nvme group's fault-free run" >&2
    return
  fi
  local n
  for n in 5 8 10 16 32; do nofile_case $n; done
}

# --------------------------------------------------------------------------------------------
# 6. bad tz-data inputs
# --------------------------------------------------------------------------------------------
TZ_DATA=$root/tools/tz-data

# data_case NAME NAMES ARGS...: tz-data ARGS (in the case directory) refused: exit 2, a message
# naming NAMES, no file under out/
data_case() {
  local name=$1 names=$2
  shift 2
  case_dir tz-data "$name"
  (cd "$CASE_DIR" && eval "$DATA_SETUP") > /dev/null 2>&1
  (cd "$CASE_DIR" && run_to 60 "$CASE_DIR/run" "$TZ_DATA" --tokenizer "$DATA_TOK" --out out --progress none "$@"
   echo "$RC $HUNG $ELAPSED" > "$CASE_DIR/status")
  read -r RC HUNG ELAPSED < "$CASE_DIR/status"
  local o m files
  o=$(classify_rc 0)
  m=$(msg "$CASE_DIR/run.err")
  files=$(find "$CASE_DIR/out" -type f 2> /dev/null | sed "s|$CASE_DIR/||" | tr '\n' ' ')
  if [ -n "$o" ]; then
    report tz-data "$name" "$o" "exit $RC after ${ELAPSED}s: ${m:-no message}"
  elif [ $RC = 0 ]; then
    report tz-data "$name" silent "accepted (exit 0), wrote: ${files:-nothing}"
  elif [ $RC != 2 ]; then
    report tz-data "$name" silent "exit $RC, the documented status of a bad input is 2: $m"
  elif [ -z "$m" ]; then
    report tz-data "$name" silent "exit 2 without a message"
  elif ! grep -Eq -- "$names" "$CASE_DIR/run.err"; then
    report tz-data "$name" silent "exit 2, the message does not name $names: $m"
  elif [ -n "$files" ]; then
    report tz-data "$name" silent "refused (exit 2: $m), but wrote $files"
  else
    report tz-data "$name" ok "exit 2, nothing written: $m"
  fi
}

group_tz_data() {
  mkdir -p "$out/tz-data"
  local py=$root/.venv/bin/python
  # tools/tz-data would make .venv (pip) without these; the campaign installs nothing
  if ! "$py" -c "import tokenizers, jinja2" 2> /dev/null; then
    echo "fault-campaign: tz-data group skipped: $root/.venv lacks tokenizers or jinja2 (bash tools/venv.sh makes it)"
    return
  fi
  DATA_TOK=$out/tz-data/tok
  mkdir -p "$DATA_TOK"
  "$py" - "$DATA_TOK" << 'EOF' > "$out/tz-data/tokenizer.log" 2>&1
import json, os, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
where = sys.argv[1]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(["tier shard block lane fence plan memory host nvme gradient"] * 20, tr)
tok.post_processor = processors.TemplateProcessing(
    single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
tok.save(os.path.join(where, "tokenizer.json"))
with open(os.path.join(where, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, f)
EOF
  if [ ! -s "$DATA_TOK/tokenizer.json" ]; then
    report tz-data tokenizer lost "could not make the test tokenizer: $(tail -1 "$out/tz-data/tokenizer.log")"
    return
  fi
  DATA_SETUP='echo "tier shard block lane" > good.txt
    printf "tier \xff\xfe shard\n" > bad.txt
    printf "{\"text\": \"tier \xff shard\"}\n" > bad.jsonl
    : > empty.txt; mkdir adir; mkfifo fifo
    yes "tier shard block lane fence" | head -n 20000 > late.txt; printf "tier \xff shard\n" >> late.txt
    printf "{\"text\": \"tier shard\"}\n{\"text\": \n" > bad-line.jsonl'
  if [ $quick = 1 ]; then
    data_case invalid-utf8 'bad\.txt.*UTF-8' bad.txt
    return
  fi
  # the control: a good input is converted (else the cases below prove nothing)
  case_dir tz-data control
  (cd "$CASE_DIR" && eval "$DATA_SETUP" && run_to 60 "$CASE_DIR/run" "$TZ_DATA" --tokenizer "$DATA_TOK" \
    --out out --progress none good.txt; echo "$RC" > "$CASE_DIR/status")
  if [ "$(cat "$CASE_DIR/status")" = 0 ] && ls "$CASE_DIR"/out/data_train_*.bin > /dev/null 2>&1; then
    report tz-data control ok "a good input converted: $(ls "$CASE_DIR/out" | tr '\n' ' ')"
  else
    report tz-data control lost "a good input was not converted: $(msg "$CASE_DIR/run.err")"
  fi
  data_case invalid-utf8 'bad\.txt.*UTF-8' bad.txt
  data_case invalid-utf8-jsonl 'bad\.jsonl.*UTF-8' bad.jsonl
  data_case invalid-utf8-late 'late\.txt.*UTF-8' --batch-bytes 4096 late.txt
  data_case invalid-utf8-second-file 'bad\.txt.*UTF-8' good.txt bad.txt
  data_case empty-file 'empty\.txt' empty.txt
  data_case directory 'adir' adir
  data_case fifo 'fifo' fifo
  data_case batch-bytes-0 'batch-bytes' --batch-bytes 0 good.txt
  data_case batch-bytes-negative 'batch-bytes' --batch-bytes -5 good.txt
  data_case shard-tokens-0 'shard-tokens' --shard-tokens 0 good.txt
  data_case missing-file 'missing\.txt' missing.txt
  data_case glob-matching-nothing 'nomatch' 'nomatch*.txt'
  data_case tokenizer-directory-empty 'adir' --tokenizer adir good.txt
  data_case bad-jsonl-line 'bad-line\.jsonl' bad-line.jsonl
}

# --------------------------------------------------------------------------------------------
group_signals
group_checkpoint
group_config
group_nvme
group_limits
group_tz_data

total=$((n_ok + n_hang + n_crash + n_silent + n_lost))
echo "fault-campaign: logs in $out ($((SECONDS - started)) s)"
echo "fault-campaign: $total cases: ok $n_ok, hang $n_hang, crash $n_crash, silent $n_silent, lost $n_lost" | tee -a "$results"
[ $total -gt 0 ] && [ $n_ok = $total ]
