#!/usr/bin/env bash
# The one command a session runs on a lent GPU machine, from a clean checkout:
#   bash scripts/gpu-check.sh [OUTDIR]        (default OUTDIR = gpu-check-out)
# 1. Unpacks .gpu-bundle/bundle.tar.xz into build-gpu/bundle (scripts/gpu-bundle.sh; Open MPI, oneDNN, Boost.Program_options,
#    Catch2, nlohmann-json, fmt) and sources its env.sh; without a bundle, the system's packages.
# 2. Finds CUDA and NCCL (/usr/local/cuda, /usr/lib/x86_64-linux-gnu, Python's nvidia/nccl wheel),
#    configures build-gpu (Release, Ninja, SHARDLAB_CUDA=ON, sm_90) and builds shardlab and the
#    executables of the tests named cuda*, on all cores.
# 3. Runs, each logged in OUTDIR/gpu-check.log with a PASS/FAIL/SKIP line and its output in
#    OUTDIR/<step>.out: nvidia-smi -L; ctest -R '^cuda'; compare on 4 ranks sharing the GPU;
#    bench-train gpt2 bf16 (fused, naive and, where cuDNN was found, cudnn attention) beside
#    profile --time's prediction of it; bench-attention flash against cudnn; the race against
#    PyTorch (transformers' GPT-2 and Llama 3.2 1B, eager and torch.compile) beside bench-train;
#    bench-collectives (nccl, world 1; staged, 4 ranks); profile --measure.
#    OUTDIR/summary.json: each step's name, status, seconds and key figures (tokens/s, busbw, peaks).
# Exit: 0 all passed (or skipped), 1 a check failed, 2 no CUDA device, 3 setup (bundle, configure,
# build) failed. Environment: SHARDLAB_GPU_JOBS (build jobs, default nproc), SHARDLAB_GPU_BUILD_DIR
# (default build-gpu), SHARDLAB_GPU_BUNDLE (default .gpu-bundle), SHARDLAB_GPU_CMAKE_ARGS (extra),
# SHARDLAB_GPU_BUDGET_S (default 460: a check that would start later than this many seconds after
# the start is skipped, and each check's time limit is cut to what is left; 8 minutes in all).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=${1:-gpu-check-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${SHARDLAB_GPU_BUILD_DIR:-build-gpu}
bundle_dir=${SHARDLAB_GPU_BUNDLE:-.gpu-bundle}
jobs=${SHARDLAB_GPU_JOBS:-$(nproc)}
logf=$out/gpu-check.log
steps=$out/steps.jsonl
: > "$logf"
: > "$steps"
t_start=$(date +%s.%N)
device=""
bundle_used=""

say() { echo "gpu-check: $*" | tee -a "$logf"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# record NAME STATUS SECONDS NOTE [OUTPUT-FILE] [COMMAND]: a PASS/FAIL/SKIP line and a JSON line.
record() {
  local name=$1 status=$2 sec=$3 note=$4 file=${5:-} cmd=${6:-}
  say "$status $name (${sec} s)${note:+: $note}"
  python3 - "$name" "$status" "$sec" "$note" "$file" "$cmd" >> "$steps" <<'PY'
import json, re, sys
name, status, sec, note, path, cmd = sys.argv[1:7]
text = open(path, errors="replace").read() if path else ""
fig = {}

def num(s):
    if s is None:
        return None
    s = s.strip().rstrip("%x")
    try:
        return float(s)
    except ValueError:
        return None

def col(header, row, name, nth=0):
    """The field of ROW right-aligned under column NAME of HEADER (printf tables: byte positions)."""
    hb, rb = header.encode(), row.encode()
    ms = list(re.finditer(rb"(?<!\S)" + re.escape(name.encode()) + rb"(?!\S)", hb))
    if len(ms) <= nth:
        return None
    end = ms[nth].end()
    if end > len(rb) or rb[end - 1:end].isspace() or (end < len(rb) and not rb[end:end + 1].isspace()):
        return None
    start = end
    while start > 0 and not rb[start - 1:start].isspace():
        start -= 1
    return num(rb[start:end].decode(errors="replace"))

def rows_after(lines, is_header):
    """(header, [rows]) of the first table whose header line satisfies is_header; rows end at a blank line."""
    for i, ln in enumerate(lines):
        if is_header(ln):
            rows = []
            for r in lines[i + 1:]:
                if not r.strip():
                    break
                rows.append(r)
            return ln, rows
    return None, []

lines = text.splitlines()
if name == "nvidia-smi":
    fig["gpus"] = [l.strip() for l in lines if l.startswith("GPU ")]
elif name == "cuda-tests":
    m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
    if m:
        fig.update(percent_passed=int(m.group(1)), failed=int(m.group(2)), total=int(m.group(3)))
    fig["skipped"] = len(re.findall(r"\*\*\*Skipped", text))
    fig["tests"] = {n: st for n, st in re.findall(r"Test +#\d+: (\S+) \.+\**\s*(\w+)", text)}
    m = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
    if m:
        fig.update(assertions=int(m.group(1)), test_cases=int(m.group(2)))
elif name == "compare":
    head, rows = rows_after(lines, lambda l: l.startswith("strategy") and "tok/s" in l)
    for r in rows:
        fig[r.split()[0]] = {k: col(head, r, k) for k in ("final loss", "ms/step", "tok/s")}
    m = re.search(r"losses agree.*", text)
    fig["losses_agree"] = m.group(0) if m else None
elif name.startswith("bench-train"):
    head, rows = rows_after(lines, lambda l: l.startswith("#configuration"))
    for r in rows:
        if r.startswith("#"):
            continue
        label = re.split(r"\s{2,}", r.strip())[0]
        vals = {k: col(head, r, k) for k in ("ms/step", "tokens/s", "GFLOP/s", "TFLOP/s", "MFU", "%MFU", "%peak", "%sgemm")}
        fig[label] = {k: v for k, v in vals.items() if v is not None}
    m = re.search(r"MFU[^0-9\n]*([0-9.]+)\s*%", text)
    if m:
        fig["mfu_percent"] = float(m.group(1))
    fig["mfu_lines"] = [l.strip() for l in lines if "MFU" in l][:4]
    m = re.search(r"^# shardlab train-step benchmark: (.*)$", text, re.M)
    if m:
        fig["config"] = m.group(1)
elif name.startswith("race-pytorch"):
    for ln in lines:
        if ln.startswith("{"):
            try:
                r = json.loads(ln)
            except ValueError:
                continue
            fig[r.get("system", "?")] = {k: r.get(k) for k in ("ms_per_step", "tokens_per_s", "mfu_pct",
                                                                "warmup_s", "peak_gib", "torch")}
elif name.startswith("bench-collectives"):
    op = None
    for ln in lines:
        m = re.match(r"# (\w+) \(busbw", ln)
        if m:
            op = m.group(1)
            continue
        f = ln.split()
        if op and len(f) >= 9 and f[0].isdigit():
            bw = num(f[7])
            d = fig.setdefault(op, {"max_busbw_GBps": 0.0})
            if bw is not None and bw > d["max_busbw_GBps"]:
                d["max_busbw_GBps"], d["at_bytes"] = bw, int(f[0])
    m = re.search(r"total #wrong: (\d+)", text)
    if m:
        fig["total_wrong"] = int(m.group(1))
elif name == "profile":
    m = re.search(r"composition at the step's peak \((\w+)\)", text)
    if m:
        fig["unit"] = m.group(1)
    head, rows = rows_after(lines, lambda l: l.startswith("strategy") and " peak" in l)
    cur = None
    for r in rows:
        f = r.split()
        if len(f) > 1 and f[1] in ("pred", "meas"):
            cur, kind = f[0], f[1]
        elif f and f[0] in ("pred", "meas") and cur:
            kind = f[0]
        else:
            continue
        fig.setdefault(cur, {})[kind + "_peak"] = col(head, r, "peak")
    m = re.findall(r"^measured .*$", text, re.M)
    if m:
        fig["measured"] = m[:5]
print(json.dumps({"name": name, "status": status, "seconds": float(sec), "note": note,
                  "command": cmd, "output": path.rsplit("/", 1)[-1] if path else "", "figures": fig}))
PY
}

# run_step NAME TIMEOUT_S COMMAND...: runs it (output in OUTDIR/NAME.out and the log), records it.
# The status comes from the exit code, or from check_NAME (if defined) reading the output.
run_step() {
  local name=$1 limit=$2; shift 2
  local f=$out/$name.out t0 rc status note="" left
  # The checks after the build share one time budget (a lent machine's time is short).
  if [ -n "${checks_deadline:-}" ]; then
    left=$(( checks_deadline - $(date +%s) ))
    if [ $left -lt 20 ]; then
      skip_step "$name" "out of time (SHARDLAB_GPU_BUDGET_S=$budget)"
      return 0
    fi
    [ $left -lt "$limit" ] && limit=$left
  fi
  say "-- $name: $*"
  t0=$(now)
  set +e
  timeout --kill-after=10 "$limit" "$@" > "$f" 2>&1
  rc=$?
  set -e
  cat "$f" >> "$logf"
  tail -n 5 "$f" | sed 's/^/    /'
  if [ $rc -eq 0 ]; then status=PASS; else status=FAIL; note="exit $rc"; fi
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note="timed out after ${limit} s"; fi
  if [ $status = PASS ] && declare -F "check_$name" >/dev/null; then
    note=$("check_$name" "$f") || status=FAIL
  fi
  record "$name" "$status" "$(secs "$t0" "$(now)")" "$note" "$f" "$*"
  [ $status = PASS ]
}
skip_step() { record "$1" SKIP 0 "$2"; }

write_summary() {
  local code=$1
  python3 - "$steps" "$out/summary.json" "$code" "$device" "$bundle_used" "$(secs "$t_start" "$(now)")" \
    "$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" "$(git -C "$repo" status --porcelain 2>/dev/null | wc -l)" <<'PY'
import json, socket, sys, time
steps_path, out, code, device, bundle, total, commit, dirty = sys.argv[1:9]
steps = [json.loads(l) for l in open(steps_path) if l.strip()]
status = {"0": "PASS", "1": "FAIL", "2": "NO_DEVICE", "3": "SETUP_FAILED"}.get(code, "FAIL")
json.dump({"schema": "shardlab.gpu-check/1", "status": status, "exit_code": int(code),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
           "device": device or None, "bundle": bundle or None, "commit": commit,
           "uncommitted_files": int(dirty), "total_seconds": float(total), "steps": steps},
          open(out, "w"), indent=2)
PY
  say "summary: $out/summary.json (status exit $code)"
}
finish() { write_summary "$1"; exit "$1"; }

command -v python3 >/dev/null || { echo "gpu-check: python3 is missing (it writes summary.json)" >&2; exit 3; }
say "shardlab GPU check in $repo -> $out ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, build jobs $jobs)"

# ---- 1. the bundle, or the system's packages ------------------------------------------------------
t0=$(now)
if [ -f "$bundle_dir/bundle.tar.xz" ]; then
  # Unpacked inside the build directory: .gpu-bundle stays the archive alone (it travels, 64 MiB at
  # most with the working tree), and the paths CMake caches live and go with the build.
  dest=$build/bundle
  stamp=$(stat -c '%s %Y' "$bundle_dir/bundle.tar.xz")
  if [ ! -f "$dest/.stamp" ] || [ "$(cat "$dest/.stamp")" != "$stamp" ]; then
    rm -rf "$dest" && mkdir -p "$dest"
    if command -v xz >/dev/null; then
      tar -C "$dest" -xJf "$bundle_dir/bundle.tar.xz"
    else  # no xz binary: Python's tarfile reads .tar.xz itself
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle_dir/bundle.tar.xz" "$dest"
    fi
    echo "$stamp" > "$dest/.stamp"
  fi
  bundle_used=$(cd "$dest/shardlab-bundle" && pwd)
  # A cache configured against another copy of the bundle would keep its paths: configure afresh.
  if [ -f "$build/CMakeCache.txt" ] && ! grep -qF "$bundle_used/" "$build/CMakeCache.txt"; then
    say "the CMake cache in $build points at another bundle: configuring afresh"
    rm -f "$build/CMakeCache.txt"
  fi
  # shellcheck disable=SC1091
  source "$bundle_used/env.sh" "$bundle_used" || { record bundle FAIL "$(secs "$t0" "$(now)")" "env.sh failed"; finish 3; }
  record bundle PASS "$(secs "$t0" "$(now)")" "$bundle_used ($(grep -vc '^#' "$bundle_used/MANIFEST") packages)"
else
  say "no $bundle_dir/bundle.tar.xz: using the system's packages (scripts/gpu-bundle.sh makes the bundle on a Debian machine)"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  missing=()
  command -v mpirun >/dev/null || missing+=("Open MPI (mpirun)")
  command -v mpicxx >/dev/null || missing+=("Open MPI wrappers (mpicxx)")
  if [ ${#missing[@]} -gt 0 ]; then
    record bundle FAIL "$(secs "$t0" "$(now)")" "no bundle and missing: ${missing[*]}"
    finish 3
  fi
  record bundle SKIP "$(secs "$t0" "$(now)")" "no bundle: system packages"
fi

# ---- 2. CUDA and NCCL -----------------------------------------------------------------------------
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDLAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then record toolchain FAIL 0 "no nvcc on PATH or in /usr/local/cuda/bin"; finish 3; fi
cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
for tool in cmake ninja c++; do
  command -v $tool >/dev/null || { record toolchain FAIL 0 "'$tool' is missing"; finish 3; }
done
nccl_dirs=("$cuda_home" "$cuda_home/targets/x86_64-linux" /usr/local/cuda /usr /usr/local)
while read -r d; do [ -n "$d" ] && nccl_dirs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, importlib.util, os, site
seen = []
try:
    spec = importlib.util.find_spec("nvidia.nccl")
    seen += list(spec.submodule_search_locations or []) if spec else []
except Exception:
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    seen += glob.glob(os.path.join(sp, "nvidia", "nccl"))
for d in dict.fromkeys(seen):
    print(d)
PY
)
nccl_inc="" nccl_lib=""
for d in "${nccl_dirs[@]}"; do
  [ -z "$nccl_inc" ] && [ -f "$d/include/nccl.h" ] && nccl_inc=$d/include
  if [ -z "$nccl_lib" ]; then
    for l in "$d"/lib64/libnccl.so "$d"/lib/libnccl.so "$d"/lib/x86_64-linux-gnu/libnccl.so \
             "$d"/lib64/libnccl.so.2 "$d"/lib/libnccl.so.2 "$d"/lib/x86_64-linux-gnu/libnccl.so.2; do
      [ -e "$l" ] && { nccl_lib=$(readlink -f "$l"); break; }
    done
  fi
done
if [ -z "$nccl_inc" ] || [ -z "$nccl_lib" ]; then
  record toolchain FAIL 0 "NCCL not found (nccl.h: ${nccl_inc:-missing}, libnccl.so: ${nccl_lib:-missing}); searched ${nccl_dirs[*]}"
  finish 3
fi
cmake_args+=(-DNCCL_INCLUDE_DIR="$nccl_inc" -DNCCL_LIBRARY="$nccl_lib")
# NCCL's directory goes last, and not at all when the loader searches it anyway: on the lent machine it
# is /usr/lib/x86_64-linux-gnu, which also holds the system's Open MPI, and put first it made the
# bundle's mpirun and orted load the system's libopen-rte and libpmix (orted crashed in MPI_Init).
nccl_libdir=$(dirname "$nccl_lib")
case ":/lib:/usr/lib:/lib64:/usr/lib64:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:" in
  *":$nccl_libdir:"*) ;;
  *) export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl_libdir ;;
esac
# shellcheck disable=SC2206
# cuDNN (beside CUDA, or Python's nvidia/cudnn wheel) and cudnn-frontend's headers (the bundle's
# cudnn-frontend/, or build/cudnn-frontend carried from a machine with PyPI:
# scripts/fetch-cudnn-frontend.sh) for --attention cudnn; without them it is left out, and said.
cudnn_inc="" cudnn_lib="" fe_inc=""
cudnn_dirs=("$cuda_home" "$cuda_home/targets/x86_64-linux" /usr/local/cuda /usr)
while read -r d; do [ -n "$d" ] && cudnn_dirs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os, site
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for d in glob.glob(os.path.join(sp, "nvidia", "cudnn")):
        print(d)
PY
)
for d in "${cudnn_dirs[@]}"; do
  [ -f "$d/include/cudnn.h" ] || continue
  for l in "$d"/lib64/libcudnn.so "$d"/lib/libcudnn.so "$d"/lib64/libcudnn.so.9 "$d"/lib/libcudnn.so.9 \
           "$d"/lib/x86_64-linux-gnu/libcudnn.so.9; do
    [ -e "$l" ] && { cudnn_inc=$d/include cudnn_lib=$(readlink -f "$l"); break 2; }
  done
done
for d in "$bundle_dir/cudnn-frontend/include" build/cudnn-frontend/include "$build/cudnn-frontend/include"; do
  [ -f "$d/cudnn_frontend.h" ] && { fe_inc=$(cd "$d" && pwd); break; }
done
if [ -n "$cudnn_lib" ] && [ -n "$fe_inc" ]; then
  cmake_args+=(-DSHARDLAB_CUDNN=ON -DCUDNN_INCLUDE_DIR="$cudnn_inc" -DCUDNN_LIBRARY="$cudnn_lib"
               -DSHARDLAB_CUDNN_FRONTEND_DIR="$fe_inc")
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$(dirname "$cudnn_lib"):"*) ;;
    *) export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$cudnn_lib") ;;
  esac
  record cudnn PASS 0 "cuDNN $cudnn_lib, cudnn-frontend $fe_inc"
else
  cmake_args+=(-DSHARDLAB_CUDNN=OFF)
  record cudnn SKIP 0 "--attention cudnn left out: cuDNN ${cudnn_lib:-not found}, cudnn-frontend headers ${fe_inc:-not found (carry build/cudnn-frontend)}"
fi
[ -n "${SHARDLAB_BUNDLE_CMAKE_ARGS:-}" ] && cmake_args+=($SHARDLAB_BUNDLE_CMAKE_ARGS)
# shellcheck disable=SC2206
[ -n "${SHARDLAB_GPU_CMAKE_ARGS:-}" ] && cmake_args+=($SHARDLAB_GPU_CMAKE_ARGS)
record toolchain PASS 0 "nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $(cmake --version | head -1), NCCL $nccl_lib"

# ---- 3. configure and build -----------------------------------------------------------------------
run_step configure 300 cmake -S . -B "$build" "${cmake_args[@]}" || finish 3
# shardlab, and what the tests named cuda* run from the build tree: read from CTestTestfile.cmake
# (ctest --show-only=json-v1 leaves out the command of a test whose executable is not built yet),
# kept where Ninja knows the path as a target.
mapfile -t targets < <(python3 - "$build" <<'PY'
import os, re, sys
# CMake writes the build directory as it was given; a link on the way (/work -> /mnt/work) makes
# realpath differ from it, so both spellings are looked for.
builds = list(dict.fromkeys([os.path.abspath(sys.argv[1]), os.path.realpath(sys.argv[1])]))
build = builds[0]
# The executables the cuda* tests are known to run, should the parse below miss them (ninja drops
# the ones that do not exist).
seen = ["shardlab", "tests/cuda_tests", "tests/strategy_tests", "tests/tp_tests", "tests/tp_strategy_tests"]
for d, _, files in os.walk(build):
    if "CTestTestfile.cmake" not in files:
        continue
    for ln in open(os.path.join(d, "CTestTestfile.cmake"), errors="replace"):
        m = re.match(r"\s*add_test\((?:\[=\[)?([^\]\s\"]+)(?:\]=\])?\s+(.*)$", ln)
        if not m or not m.group(1).startswith("cuda"):
            continue
        for b in builds:
            for p in re.findall(re.escape(b) + r"/[^\s\"';]+", m.group(2)):
                rel = os.path.relpath(p, b)
                if rel not in seen:
                    seen.append(rel)
print("\n".join(seen))
PY
)
for i in "${!targets[@]}"; do
  ninja -C "$build" -t query "${targets[$i]}" >/dev/null 2>&1 || unset 'targets[i]'
done
targets=("${targets[@]}")
[ ${#targets[@]} -gt 0 ] || targets=(shardlab)
run_step build 1800 cmake --build "$build" -j "$jobs" --target "${targets[@]}" || finish 3
exe=$build/shardlab

# ---- 4. the checks --------------------------------------------------------------------------------
failed=0
# Seconds from the start for everything; the checks get what the setup and build left.
budget=${SHARDLAB_GPU_BUDGET_S:-460}
checks_deadline=$(( ${t_start%.*} + budget ))
# a. the device
t0=$(now)
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L > "$out/nvidia-smi.out" 2>&1 || ! grep -q '^GPU ' "$out/nvidia-smi.out"; then
  command -v nvidia-smi >/dev/null || echo "nvidia-smi: not found" > "$out/nvidia-smi.out"
  cat "$out/nvidia-smi.out" >> "$logf"
  record nvidia-smi FAIL "$(secs "$t0" "$(now)")" "no CUDA device" "$out/nvidia-smi.out" "nvidia-smi -L"
  say "no CUDA device: built $exe, stopping before the CUDA checks"
  finish 2
fi
device=$(grep '^GPU ' "$out/nvidia-smi.out" | head -1 | sed 's/ (UUID.*//')
record nvidia-smi PASS "$(secs "$t0" "$(now)")" "$device" "$out/nvidia-smi.out" "nvidia-smi -L"

# b. the CUDA tests (every test whose name starts with cuda); a skip on a machine with a GPU fails.
check_cuda-tests() {
  grep -q 'No tests were found' "$1" && { echo "no test named cuda*"; return 1; }
  grep -q '\*\*\*Skipped' "$1" && { echo "skipped although a device is present"; return 1; }
  grep -o '[0-9]*% tests passed.*' "$1" | head -1
}
run_step cuda-tests 300 ctest --test-dir "$build" -R '^cuda' --output-on-failure || failed=1

# c. compare on 4 ranks sharing the GPU.
check_compare() {
  grep -q 'losses agree' "$1" || { echo "no 'losses agree' line"; return 1; }
  grep -o 'losses agree.*' "$1" | head -1
}
run_step compare 240 "$exe" compare --device cuda --nproc 4 --model small --steps 10 --comm auto || failed=1

# d. training-step throughput: gpt2, bf16 parameters, 8 x 1024 tokens; DDP, then ZeRO-3 at world 1
#    (the issue's bar: ZeRO-3 within 5% of DDP's step time).
for strategy in ddp zero3; do
  name=bench-train; [ $strategy = ddp ] || name=bench-train-$strategy
  run_step $name 180 "$exe" bench-train --device cuda --model gpt2 --seq 1024 --batch 8 --steps 5 --warmup 2 \
    --param-dtype bf16 --strategy $strategy || failed=1
done

# d2. the step's time predicted (profile --time: the meta step's cost ledger priced as an H200, no
#     GPU needed) beside what bench-train measures, with the fused attention (measured in d) and the
#     naive one (docs/performance.md, "Predicted step time"). The ledger's launches against CUPTI's
#     count of a real step are a [cuda] test (cuda-tests, above).
run_step bench-train-naive 180 "$exe" bench-train --device cuda --model gpt2 --seq 1024 --batch 8 --steps 5 \
  --warmup 2 --param-dtype bf16 --attention naive || failed=1
# cuDNN's fused attention (--attention cudnn), where the build has it: the same step and its
# prediction, and the kernels alone beside the fused one.
if [ -n "$cudnn_lib" ] && [ -n "$fe_inc" ]; then
  run_step bench-train-cudnn 180 "$exe" bench-train --device cuda --model gpt2 --seq 1024 --batch 8 --steps 5 \
    --warmup 2 --param-dtype bf16 --attention cudnn || failed=1
  run_step bench-attention-cudnn 120 "$exe" bench-attention --device cuda --kernels flash,cudnn --seqs 1024,4096 \
    --heads 12 --head-dims 64 --repeats 3 --warmup 1 || failed=1
fi
for attention in flash naive cudnn; do
  run_step profile-time-$attention 60 "$exe" profile --time --device cuda --gpu h200 --model gpt2 --micro-batch 8 \
    --seq 1024 --param-dtype bf16 --strategies ddp --world 1 --attention $attention --top 0 || failed=1
done

# d3. the race: PyTorch on the same GPU in the same run (benchmarks/race_pytorch.py: transformers'
#     GPT2LMHeadModel and LlamaForCausalLM from configs, f32 weights under bf16 autocast, SDPA, fused
#     AdamW, clip 1.0; eager, then torch.compile) beside shardlab's bench-train at the same shapes:
#     GPT-2 124M at 8 x 1,024 (shardlab's rows: d and d2) and Llama 3.2 1B at 4 x 2,048.
check_race() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not rows:
    sys.exit("no result line")
print("; ".join(f"{r['system']}: {r['tokens_per_s']:.0f} tok/s, MFU {r['mfu_pct']}%" for r in rows))
PY
}
check_race-pytorch-gpt2() { check_race "$1"; }
check_race-pytorch-llama() { check_race "$1"; }
if python3 -c 'import torch, transformers' 2>/dev/null; then
  run_step race-pytorch-gpt2 240 python3 benchmarks/race_pytorch.py --model gpt2 --batch 8 --seq 1024 --steps 10 \
    --warmup 3 --device cuda || failed=1
  llama_attention=naive
  [ -n "$cudnn_lib" ] && [ -n "$fe_inc" ] && llama_attention=cudnn
  run_step bench-train-llama 180 "$exe" bench-train --device cuda --model llama3.2-1b --seq 2048 --batch 4 \
    --steps 5 --warmup 2 --param-dtype bf16 --attention $llama_attention || failed=1
  run_step race-pytorch-llama 240 python3 benchmarks/race_pytorch.py --model llama3.2-1b --batch 4 --seq 2048 \
    --steps 10 --warmup 3 --device cuda || failed=1
else
  skip_step race-pytorch "this machine's Python has no torch and transformers"
fi

# e. collectives: NCCL on one rank, the staged communicator on 4 ranks sharing the GPU.
check_collectives() {
  local w
  w=$(sed -n 's/.*total #wrong: \([0-9]*\).*/\1/p' "$1" | tail -1)
  [ -n "$w" ] || { echo "no 'total #wrong' line"; return 1; }
  [ "$w" = 0 ] || { echo "total #wrong: $w"; return 1; }
  echo "total #wrong: 0"
}
check_bench-collectives-nccl() { check_collectives "$1"; }
check_bench-collectives-staged() { check_collectives "$1"; }
run_step bench-collectives-nccl 150 "$exe" bench-collectives --comm nccl --device cuda --dtype bf16 || failed=1
# Staged: every call crosses to the host and back, 4 ranks on one GPU: smaller sizes keep it short.
run_step bench-collectives-staged 150 "$exe" bench-collectives --comm staged --device cuda --nproc 4 --dtype bf16 \
  --max-bytes 16MiB || failed=1

# f. measured memory against predicted on the device.
run_step profile 240 "$exe" profile --measure --device cuda --strategies zero3 --model small || failed=1

if [ $failed -ne 0 ]; then say "some checks FAILED (see $logf)"; finish 1; fi
say "all checks passed"
finish 0
