#!/usr/bin/env bash
# Fetches cudnn-frontend's headers (NVIDIA's header-only C++ API over cuDNN's graph backend) into
# DIR/include (default build/cudnn-frontend), from the nvidia-cudnn-frontend wheel on PyPI (12 MB;
# only its include/ is kept). Pinned by version; not committed. CMake looks there for
# --attention cudnn (CMakeLists.txt, SHARDLAB_CUDNN); scripts/setup.sh runs this wherever it builds
# the CUDA backend, and scripts/gpu-bundle.sh packs the result for a GPU machine without PyPI.
set -euo pipefail
dir=${1:-build/cudnn-frontend}
version=1.32.0
if [ -f "$dir/include/cudnn_frontend.h" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$version" ]; then exit 0; fi
command -v pip3 >/dev/null || command -v pip >/dev/null || { echo "fetch-cudnn-frontend: pip is not installed" >&2; exit 1; }
pip=$(command -v pip3 || command -v pip)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timeout 120 "$pip" download --quiet --timeout 10 --retries 1 --no-deps --only-binary :all: \
  "nvidia-cudnn-frontend==$version" -d "$tmp" >/dev/null 2>&1 ||
  { echo "fetch-cudnn-frontend: pip download nvidia-cudnn-frontend==$version failed (is PyPI reachable?)" >&2; exit 1; }
wheel=$(ls "$tmp"/nvidia_cudnn_frontend-"$version"-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "fetch-cudnn-frontend: no wheel of $version downloaded" >&2; exit 1; }
rm -rf "$dir/include"
mkdir -p "$dir"
python3 - "$wheel" "$dir" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit("fetch-cudnn-frontend: the wheel has no include/cudnn_frontend.h")
    for n in names:
        z.extract(n, out)
PY
echo "$version" > "$dir/VERSION"
echo "fetch-cudnn-frontend: cudnn-frontend $version headers in $dir/include"
