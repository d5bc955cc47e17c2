#!/usr/bin/env bash
# Faults of long runs, with real signals and real limits. Each case prints what happened and ends
# with PASS (CTest matches it) or FAIL and a non-zero exit.
# usage: faults.sh SHARDLAB CASE     CASE: sigterm_all | sigterm_one | sigusr1_mpirun | sigterm_no_save_dir |
#                                          sigint_saves | sigint_no_save_dir | sigint_launcher |
#                                          sigint_twice_launcher | sigterm_launcher | save_ulimit | sigkill_midstep |
#                                          save_keep | save_dir_locked | save_dir_foreign | save_fails | soak |
#                                          save_async | save_async_killed
set -u
bin=$1 case=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# A constant schedule: the learning rate of a step must not depend on --steps, which differs
# between the interrupted run and the ones it is compared with.
train=("$bin" train --model tiny --batch 4 --threads 1 --print-every 100000 --schedule constant)

fail() { echo "FAIL: $*"; exit 1; }
# (A resumed run's log starts with a {"event": "resume", ...} line: markers have no loss.)
losses() { python3 -c "import json,sys; print(' '.join(repr(j['loss']) for j in map(json.loads, open(sys.argv[1])) if 'loss' in j))" "$1"; }
# The PID of rank $1 of the job started last: a child of its mpirun, which is the child of the --nproc
# launcher ($job), found by the MPI rank in its environment. Only this job's processes are ever signalled.
rank_pid() {
  for m in $(pgrep -P "$job"); do
    for p in $(pgrep -P "$m"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
    done
  done
}
# Waits for the job, at most $1 seconds (a broken handler must fail the test, not hang it).
wait_job() {
  for _ in $(seq 1 $(($1 * 10))); do
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$job" 2>/dev/null; then kill -KILL "$job"; fail "the job did not end within $1 s"; fi
  wait "$job"
}
wait_for_steps() {  # until the JSONL log has $2 lines
  for _ in $(seq 1 300); do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "the run did not reach step $2"
}
# Whether two safetensors files hold the same tensors, bit for bit (their metadata aside).
same_tensors() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    data = b[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
PY
}
# The losses of steps first..last of an uninterrupted run equal those of the resumed run's log.
check_resume_identical() {  # log_of_resumed_part total_steps
  "${train[@]}" --nproc 2 --steps "$2" --log "$work/full.log" >/dev/null 2>&1 || fail "uninterrupted run failed"
  local got want
  got=$(losses "$1")
  want=$(losses "$work/full.log" | tr ' ' '\n' | tail -n "$(echo "$got" | wc -w)" | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] || fail "resumed losses differ: [$got] vs [$want]"
  echo "resumed losses bit-identical to the uninterrupted run's ($(echo "$got" | wc -w) steps)"
}

# SIGTERM at the --nproc launcher once both ranks printed MARK under the test hook HOOK=S (a
# VAR=VALUE), before their run: the job ends within WAIT s with 143, every rank saying why, nothing saved.
sigterm_before_run() {
  local hook=$1 mark=$2 wait=$3
  env "$hook" "${train[@]}" --nproc 2 --steps 5 --save-dir "$work/ck" >"$work/out" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    [ "$(grep -c "$mark" "$work/out")" -ge 2 ] && break
    sleep 0.1
  done
  [ "$(grep -c "$mark" "$work/out")" -ge 2 ] || fail "the ranks did not start"
  kill -TERM "$job"
  wait_job "$wait"; rc=$?
  cat "$work/out"
  [ $rc -eq 143 ] || fail "expected exit 143, got $rc"
  [ "$(grep -c 'terminated (SIGTERM at the launcher): ending now, nothing saved' "$work/out")" -eq 2 ] ||
    fail "not every rank said why"
  [ ! -e "$work/ck" ] || [ -z "$(ls "$work/ck")" ] || fail "a checkpoint appeared"
}

case $case in
sigterm_all | sigterm_one | sigusr1_mpirun | sigterm_launcher)
  "${train[@]}" --nproc 2 --steps 1000000 --save-dir "$work/ck" --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  wait_for_steps "$work/a.log" 50
  t0=$(date +%s%N)
  # The launcher passes SIGUSR1 on to mpirun, which forwards it to the ranks (SIGTERM it answers by
  # killing them a second later). SIGTERM at the launcher (what timeout, systemd and Kubernetes send)
  # it passes on as SIGUSR1: the job saves and exits 0 (it exited 1 when SIGTERM went to mpirun).
  if [ "$case" = sigusr1_mpirun ]; then kill -USR1 "$job"
  elif [ "$case" = sigterm_launcher ]; then kill -TERM "$job"
  elif [ "$case" = sigterm_all ]; then kill -TERM $(rank_pid 0) $(rank_pid 1); else kill -TERM $(rank_pid 1); fi
  wait_job 60; rc=$?
  echo "exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms"; grep -v '^step' "$work/out"
  [ $rc -eq 0 ] || fail "expected exit 0"
  n=$(sed -n 's/^saved step \([0-9]*\) on SIG[A-Z0-9]*$/\1/p' "$work/out")
  [ -n "$n" ] && [ -d "$work/ck/step_$(printf %08d "$n")" ] || fail "no checkpoint of the step in progress"
  "${train[@]}" --nproc 2 --steps $((n + 5)) --save-dir "$work/ck" --resume auto --log "$work/b.log" >/dev/null 2>&1 ||
    fail "resume failed"
  check_resume_identical "$work/b.log" $((n + 5))
  ;;
sigterm_launcher_at_start)
  # SIGTERM at the launcher while the ranks are still starting (here held 60 s in main by the test
  # hook, their early handlers in place): every rank ends with 143 and says why (it was SIGUSR1's
  # death, 138, with Open MPI's banner alone).
  sigterm_before_run SHARDLAB_FAULT_SLOW_START=60 'starting 60 s late' 30
  ;;
sigterm_launcher_before_handlers)
  # SIGTERM at the launcher between the ranks' exec and their early handlers (held there 3 s by the
  # test hook): the launcher holds the stop until every rank on its host says it is ready, then
  # forwards it, and every rank ends with 143 saying why (a SIGUSR1 there was a death by signal, 138).
  sigterm_before_run SHARDLAB_FAULT_SLOW_EXEC=3 's before the early handlers' 60
  ;;
sigterm_no_save_dir)
  "${train[@]}" --nproc 2 --steps 1000000 --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  wait_for_steps "$work/a.log" 20
  kill -TERM $(rank_pid 0)
  wait_job 60; rc=$?
  grep -v '^step' "$work/out"
  [ $rc -ne 0 ] || fail "expected a non-zero exit without --save-dir"
  grep -q "no --save-dir to save to" "$work/out" || fail "the message does not say why"
  ;;
sigint_saves | sigint_no_save_dir)
  # Ctrl-C reaches a foreground process: one process, no mpirun (which answers SIGINT itself). A
  # background job of a script starts with SIGINT ignored, and shardlab keeps it so; job control
  # (set -m) starts it as a foreground job would, taking SIGINT.
  set -m
  extra=(); [ "$case" = sigint_saves ] && extra=(--save-dir "$work/ck")
  "${train[@]}" --steps 1000000 "${extra[@]}" --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  set +m
  wait_for_steps "$work/a.log" 20
  kill -INT "$job"
  wait_job 60; rc=$?
  grep -v '^step' "$work/out"
  [ $rc -eq 130 ] || fail "expected exit 130 after SIGINT, got $rc"
  if [ "$case" = sigint_no_save_dir ]; then
    grep -q "interrupted (SIGINT): stopping now" "$work/out" || fail "the message does not say it stopped"
  else
    n=$(sed -n 's/^saved step \([0-9]*\) on SIGINT$/\1/p' "$work/out")
    [ -n "$n" ] && [ -d "$work/ck/step_$(printf %08d "$n")" ] || fail "no checkpoint of the step in progress"
    # The resumed run appends to the same log: the earlier steps stay, after them a resume marker.
    "${train[@]}" --steps $((n + 5)) --save-dir "$work/ck" --resume auto --log "$work/a.log" >"$work/b.out" 2>&1 ||
      fail "resume failed"
    grep '^done' "$work/b.out"
    [ "$(losses "$work/a.log" | wc -w)" -eq $((n + 5)) ] || fail "the log does not hold steps 1-$((n + 5))"
    python3 -c "import json,sys; n=int(sys.argv[2]); r=[j for j in map(json.loads, open(sys.argv[1])) if j.get('event') == 'resume']; \
sys.exit(0 if any(j['step'] == n and j['from'].endswith('step_%08d' % n) for j in r) else 1)" "$work/a.log" "$n" ||
      fail "no resume marker in the log"
    "${train[@]}" --steps $((n + 5)) --log "$work/full.log" >/dev/null 2>&1 || fail "uninterrupted run failed"
    [ "$(losses "$work/a.log")" = "$(losses "$work/full.log")" ] || fail "the saved and resumed losses differ"
    echo "saved step $n on SIGINT; resumed to step $((n + 5)), log bit-identical to the uninterrupted run's"
  fi
  ;;
sigint_launcher | sigint_twice_launcher)
  # Ctrl-C at the --nproc launcher: a terminal's Ctrl-C reaches it alone (mpirun and the ranks run in
  # process groups of their own); it passes it on to every rank, which takes it as one process does:
  # the first saves after the step in progress and the run exits 130, a second stops at once. Job
  # control (set -m) starts the launcher as a foreground job would, taking SIGINT.
  run=("${train[@]}")
  # Twice: steps of a second or more (more under load), so that the second Ctrl-C, sent as soon as a
  # rank has taken the first, arrives before the step in progress ends.
  [ "$case" = sigint_twice_launcher ] && run=("$bin" train --model small --batch 64 --threads 1 --print-every 100000
                                              --schedule constant --sgemm-ceiling off)
  set -m
  "${run[@]}" --nproc 2 --steps 1000000 --save-dir "$work/ck" --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  set +m
  wait_for_steps "$work/a.log" $([ "$case" = sigint_launcher ] && echo 20 || echo 2)
  kill -INT "$job"
  if [ "$case" = sigint_twice_launcher ]; then
    for _ in $(seq 1 600); do grep -q "SIGINT: saving a checkpoint after this step" "$work/out" && break; sleep 0.1; done
    grep -q "SIGINT: saving a checkpoint after this step" "$work/out" || fail "no rank took the first Ctrl-C"
    kill -INT "$job"
  fi
  wait_job 120; rc=$?
  grep -v '^step' "$work/out"
  [ $rc -eq 130 ] || fail "expected exit 130 after SIGINT, got $rc"
  if [ "$case" = sigint_twice_launcher ]; then
    grep -q "interrupted (SIGINT): stopping now, without a checkpoint" "$work/out" || fail "the message does not say it stopped"
    ! grep -q '^saved step' "$work/out" || fail "the second Ctrl-C did not stop the run before its save"
    [ -z "$(ls "$work/ck" | grep '^step_')" ] || fail "a checkpoint was written: $(ls "$work/ck")"
    echo "the second Ctrl-C stopped the run at once, without a checkpoint"
  else
    n=$(sed -n 's/^saved step \([0-9]*\) on SIGINT$/\1/p' "$work/out")
    [ -n "$n" ] && [ -d "$work/ck/step_$(printf %08d "$n")" ] || fail "no checkpoint of the step in progress"
    ! grep -qi -e 'primary job' -e 'non-zero' "$work/out" || fail "Open MPI's note after a saved Ctrl-C"
    "${train[@]}" --nproc 2 --steps $((n + 5)) --save-dir "$work/ck" --resume auto --log "$work/b.log" >/dev/null 2>&1 ||
      fail "resume failed"
    check_resume_identical "$work/b.log" $((n + 5))
  fi
  ;;
save_ulimit)
  # A first checkpoint at step 4; then, with a file-size limit (ulimit -f 8192: 8 MiB; Open MPI's
  # own shared-memory files need a few MiB) below one rank file (9.5 MiB), the save of
  # step 8 fails: non-zero, naming the file and the reason; step 4 stays the newest and resumes.
  small=("$bin" train --model small --seq 32 --batch 4 --threads 1)
  "${small[@]}" --nproc 2 --steps 4 --save-dir "$work/ck" >/dev/null 2>&1 || fail "first run failed"
  mpirun -np 2 --bind-to none bash -c "ulimit -f 8192; exec ${small[*]} --steps 8 --save-dir $work/ck --resume auto" \
    >"$work/out" 2>&1
  rc=$?
  grep -v '^step' "$work/out" | grep -i "error\|saving" | head -3
  [ $rc -ne 0 ] || fail "expected a non-zero exit"
  grep -q "rank_0000[01].bin' failed at byte [0-9]*: File too large" "$work/out" || fail "the file and reason are not named"
  # (.lock: the run's lock on the directory, which stays for the next run)
  [ "$(ls -A "$work/ck" | grep -vx .lock)" = "step_00000004" ] || fail "expected only step_00000004 left: $(ls -A "$work/ck")"
  "${small[@]}" --nproc 2 --steps 8 --save-dir "$work/ck" --resume auto --log "$work/b.log" >/dev/null 2>&1 || fail "resume failed"
  "${small[@]}" --nproc 2 --steps 8 --log "$work/full.log" >/dev/null 2>&1 || fail "uninterrupted run failed"
  [ "$(losses "$work/b.log")" = "$(losses "$work/full.log" | cut -d' ' -f5-)" ] || fail "resumed losses differ"
  echo "resumed from step 4: losses of steps 5-8 bit-identical"
  ;;
sigkill_midstep)
  "${train[@]}" --nproc 2 --steps 1000000 --save-dir "$work/ck" --save-every 20 --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  wait_for_steps "$work/a.log" 50
  t0=$(date +%s%N)
  kill -KILL $(rank_pid 1)
  wait_job 60; rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "exit $rc, job ended $ms ms after SIGKILL"
  [ $rc -ne 0 ] || fail "expected a non-zero exit"
  [ $ms -lt 10000 ] || fail "the job took too long to end"
  last=$(ls "$work/ck" | grep '^step_' | tail -1)
  n=$((10#${last#step_}))
  "${train[@]}" --nproc 2 --steps $((n + 5)) --save-dir "$work/ck" --resume auto --log "$work/b.log" >/dev/null 2>&1 ||
    fail "resume failed"
  check_resume_identical "$work/b.log" $((n + 5))
  ;;
save_async)
  # Checkpoints written in the background are those a synchronous save writes, byte for byte; SIGTERM
  # at the launcher waits for the save in flight, saves the step in progress and exits 0.
  "${train[@]}" --nproc 2 --steps 14 --save-every 7 --run-id same --save-dir "$work/sync" >/dev/null 2>&1 || fail "sync run failed"
  "${train[@]}" --nproc 2 --steps 14 --save-every 7 --run-id same --save-dir "$work/async" --save-async >"$work/out" 2>&1 ||
    fail "async run failed"
  grep '^checkpoint' "$work/out"
  diff -r -x .lock "$work/sync" "$work/async" || fail "the background save's checkpoints differ from the synchronous ones"
  echo "checkpoints of steps 7 and 14 identical written in the background and synchronously"
  "${train[@]}" --nproc 2 --steps 1000000 --save-dir "$work/ck" --save-every 3 --save-async --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  wait_for_steps "$work/a.log" 50
  kill -TERM "$job"
  wait_job 60; rc=$?
  grep -v '^step' "$work/out" | tail -4
  [ $rc -eq 0 ] || fail "expected exit 0"
  n=$(sed -n 's/^saved step \([0-9]*\) on SIG[A-Z0-9]*$/\1/p' "$work/out")
  [ -n "$n" ] && [ -f "$work/ck/step_$(printf %08d "$n")/manifest.json" ] || fail "no checkpoint of the step in progress"
  [ -z "$(ls -A "$work/ck" | grep '^\.tmp')" ] || fail "a save was left half-written"
  "${train[@]}" --nproc 2 --steps $((n + 5)) --save-dir "$work/ck" --resume auto --log "$work/b.log" >/dev/null 2>&1 ||
    fail "resume failed"
  check_resume_identical "$work/b.log" $((n + 5))
  ;;
save_async_killed)
  # A rank killed while its background save writes: the previous checkpoint stays the newest
  # complete one and resumes with the uninterrupted run's losses.
  "${train[@]}" --nproc 2 --steps 10 --save-dir "$work/ck" >/dev/null 2>&1 || fail "first run failed"
  SHARDLAB_FAULT_KILL_IN_SAVE=1 "${train[@]}" --nproc 2 --strategy zero3 --steps 30 --save-every 5 --save-async --save-dir "$work/ck" \
    --resume auto >"$work/out" 2>&1
  rc=$?
  echo "exit $rc; left: $(ls "$work/ck" | tr '\n' ' ')"
  [ $rc -ne 0 ] || fail "expected the killed rank to end the job"
  [ "$(latest=$(ls "$work/ck" | grep '^step_' | tail -1); echo "$latest")" = step_00000010 ] || fail "expected step 10 newest"
  "${train[@]}" --nproc 2 --steps 15 --save-dir "$work/ck" --resume auto --log "$work/b.log" >/dev/null 2>&1 ||
    fail "resume failed"
  check_resume_identical "$work/b.log" 15
  ;;
save_frozen)
  # A rank frozen half-way through writing a checkpoint: the others, waiting for it inside the save,
  # end the job by --save-timeout (exit 5, naming it) instead of waiting forever. 120 s bounds a hang,
  # not the timing.
  SHARDLAB_FAULT_STOP_IN_SAVE=1 timeout -s KILL 120 "${train[@]}" --nproc 2 --strategy zero3 --steps 20 --save-every 5 \
    --save-dir "$work/ck" --collective-timeout 3 --save-timeout 4 >"$work/out" 2>&1
  rc=$?
  grep -v '^step' "$work/out"
  [ $rc -ne 137 ] || fail "the job hung (killed after 120 s)"
  [ $rc -eq 5 ] || fail "exit $rc, expected 5"
  grep -q "within 4 s (--save-timeout, inside a checkpoint save): rank 1 shows no sign of life" "$work/out" ||
    fail "the frozen rank and the save's limit not named"
  ;;
save_keep)
  "${train[@]}" --nproc 2 --steps 10 --save-dir "$work/ck" --save-every 2 --save-keep 2 >"$work/out" 2>&1 || fail "run failed"
  left=$(ls "$work/ck" | tr '\n' ' ')
  echo "left: $left"
  [ "$left" = "step_00000008 step_00000010 " ] || fail "expected the last two checkpoints"
  ;;
save_dir_locked)
  # Two runs on one --save-dir: the second is refused before its first step, naming the first, which
  # goes on untouched; once the first is gone (killed: the kernel drops its lock) the directory is free.
  "${train[@]}" --nproc 2 --steps 1000000 --save-dir "$work/ck" --log "$work/a.log" >"$work/out" 2>&1 &
  job=$!
  wait_for_steps "$work/a.log" 5
  "${train[@]}" --steps 3 --save-dir "$work/ck" >"$work/b.out" 2>&1
  rc=$?
  cat "$work/b.out"
  [ $rc -eq 1 ] || fail "the second run exited $rc, expected 1"
  grep -q "is in use by another run (pid [0-9]* on host .* --save-dir $work/ck" "$work/b.out" || fail "no holder named"
  kill -0 "$job" 2>/dev/null || fail "the first run died"
  n=$(wc -l <"$work/a.log")
  wait_for_steps "$work/a.log" $((n + 5))  # still training
  for p in $(pgrep -P "$job"); do pkill -KILL -P "$p"; done
  kill -KILL "$job" 2>/dev/null
  wait "$job" 2>/dev/null
  "${train[@]}" --steps 3 --save-dir "$work/ck" >"$work/d.out" 2>&1 || { cat "$work/d.out"; fail "the freed directory was refused"; }
  echo "second run refused while the first held the directory; the directory free once it was gone"
  ;;
save_dir_foreign)
  # A --save-dir belongs to one run: a fresh run into a directory holding another run's checkpoints is
  # refused (its step_00000002 would sit beside the other's step_00000004, and --resume auto would take
  # the newest of either), as is a resume of another run into it and a --run-id that is not the
  # checkpoint's; --resume auto continues the run under its id, recorded in manifest and log.
  run_id() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$1"; }
  "${train[@]}" --steps 4 --save-dir "$work/ck" --save-every 2 --log "$work/a.log" >/dev/null 2>&1 || fail "run A failed"
  a=$(run_id "$work/ck/step_00000004/manifest.json")
  echo "run A: $a"
  "${train[@]}" --steps 2 --save-dir "$work/ck" >"$work/b.out" 2>&1 && fail "a fresh run into A's directory ran"
  cat "$work/b.out"
  grep -q "holds checkpoints of run '$a' (the newest: '$work/ck/step_00000004'), and this is a fresh run" "$work/b.out" ||
    fail "the fresh run's refusal does not name run A"
  [ "$(ls "$work/ck" | tr '\n' ' ')" = "step_00000002 step_00000004 " ] || fail "A's directory changed: $(ls "$work/ck")"
  "${train[@]}" --steps 6 --save-dir "$work/ck" --resume auto --run-id other >"$work/c.out" 2>&1 && fail "--run-id other resumed A"
  grep -q "belongs to run '$a'; this run is --run-id 'other'" "$work/c.out" || { cat "$work/c.out"; fail "both ids not named"; }
  "${train[@]}" --steps 2 --save-dir "$work/ck2" --run-id c >/dev/null 2>&1 || fail "run C failed"
  "${train[@]}" --steps 4 --save-dir "$work/ck" --resume "$work/ck2/step_00000002" >"$work/d.out" 2>&1 && fail "C resumed into A's"
  grep -q "holds checkpoints of run '$a' .*this run is 'c', resumed from" "$work/d.out" || { cat "$work/d.out"; fail "C's refusal"; }
  "${train[@]}" --steps 6 --save-dir "$work/ck" --resume auto --log "$work/a.log" >/dev/null 2>&1 || fail "A's resume failed"
  [ "$(run_id "$work/ck/step_00000006/manifest.json")" = "$a" ] || fail "the resumed run's checkpoint has another id"
  [ "$(grep -c "\"run_id\":\"$a\"" "$work/a.log")" = 2 ] || fail "the log's start and resume records do not carry $a"
  echo "fresh, foreign and misnamed runs refused, naming run A; A resumed under its id"
  ;;
save_fails)
  # The --save target's directory removed mid-run: the final save fails with the system's reason,
  # the trained weights go to a checkpoint (--save-dir's end one, or one under $TMPDIR), which
  # exports to the file an undisturbed run saves, bit for bit; no temporary is left.
  mkdir -p "$work/tmp" "$work/out"
  "${train[@]}" --steps 3000 --save "$work/ref.safetensors" >/dev/null 2>&1 || fail "the reference run failed"
  for with_dir in no yes; do
    mkdir -p "$work/out"
    rm -f "$work/s.log"
    extra=()
    [ $with_dir = yes ] && extra=(--save-dir "$work/ck")
    TMPDIR="$work/tmp" "${train[@]}" --steps 3000 --save "$work/out/m.safetensors" --log "$work/s.log" "${extra[@]}" \
      >"$work/s.out" 2>&1 &
    job=$!
    wait_for_steps "$work/s.log" 5
    rm -rf "$work/out"
    wait_job 300
    rc=$?
    tail -1 "$work/s.out"
    [ $rc -eq 1 ] || fail "the run exited $rc, expected 1"
    kept=$(grep -o "the trained weights are in the checkpoint '[^']*'" "$work/s.out" | cut -d"'" -f2)
    [ -n "$kept" ] || fail "no checkpoint named"
    grep -q "failed: cannot write '$work/out/m.safetensors.tmp': No such file or directory" "$work/s.out" ||
      fail "not the system's reason"
    if [ $with_dir = yes ]; then [ "$kept" = "$work/ck/step_00003000" ] || fail "kept $kept"; fi
    if [ $with_dir = no ]; then case $kept in "$work/tmp/shardlab-rescue-"*) ;; *) fail "kept $kept" ;; esac; fi
    "$bin" export "$kept" --out "$work/again.safetensors" >/dev/null 2>&1 || fail "export of $kept failed"
    same_tensors "$work/again.safetensors" "$work/ref.safetensors" || fail "the kept weights differ from the undisturbed run's"
    rm -f "$work/again.safetensors"
    echo "--save-dir $with_dir: kept in $kept, exported bit for bit"
  done
  ;;
soak)
  # Tens of thousands of steps with checkpoints: resident memory after warm-up stays flat.
  "${train[@]}" --nproc 2 --strategy zero3 --steps 20000 --save-dir "$work/ck" --save-every 2000 --save-keep 1 \
    --log "$work/a.log" >/dev/null 2>&1 || fail "soak run failed"
  python3 - "$work/a.log" <<'PY' || exit 1
import json, sys
# A leak grows in every stretch of steps; a loaded machine can raise the high-water mark once (MPI
# buffering a lagging rank's messages, a lazily touched library page) and never again. So the run
# after warm-up is cut into four stretches of 4000 steps: the quietest must stay within 4 pages
# (4 bytes per step or more fails every stretch), and the whole run within 64 pages.
rss = [j["rss_bytes"] for j in map(json.loads, open(sys.argv[1])) if "event" not in j]  # steps only
marks = [4000, 8000, 12000, 16000, len(rss) - 1]
growth = [rss[b] - rss[a] for a, b in zip(marks, marks[1:])]
total = rss[-1] - rss[4000]
print(f"rank 0 resident memory: step 4000 {rss[4000] // 1024} KiB, step {len(rss)} {rss[-1] // 1024} KiB, "
      f"growth per 4000 steps {[g // 1024 for g in growth]} KiB, total {total // 1024} KiB")
sys.exit(0 if min(growth) <= 4 * 4096 and total <= 64 * 4096 else 1)
PY
  ;;
*) fail "unknown case $case" ;;
esac
echo PASS
