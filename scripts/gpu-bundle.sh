#!/usr/bin/env bash
# Packs the Debian 12 packages shardlab builds against that a lent GPU machine lacks (it reaches no
# package registry) into DIR/bundle.tar.xz (default DIR = .gpu-bundle), plus DIR/env.sh.
#   bash scripts/gpu-bundle.sh [DIR]
# Run on a Debian 12 (bookworm, amd64) machine with apt access; root is not needed (a private apt
# state is set up when the system's package lists are empty). Contents:
#   - Open MPI 4.1 (openmpi-bin, openmpi-common, libopenmpi3, libopenmpi-dev) and the shared
#     libraries it actually needs (hwloc, libevent, PMIx, munge, udev): the closure of the ELF
#     NEEDED entries of mpirun/orted/libmpi, not apt's Depends (no UCX, libfabric, verbs, PSM).
#     MCA components whose libraries are not in that closure (ucx, ofi, openib, psm, oshmem) are
#     dropped; shared memory (vader) and TCP remain.
#   - oneDNN (libdnnl2, libdnnl-dev) with its OpenCL ICD loader, OpenBLAS's OpenMP flavour
#     (libopenblas-openmp-dev, libopenblas0-openmp, with libgfortran), Boost.Program_options (the library
#     and just the Boost headers <boost/program_options.hpp> pulls in), Catch2 v2,
#     nlohmann-json, fmt 9.
#   - No docs, man pages, locales, static libraries, Fortran or Java bindings.
# Not included (the GPU machine has them): glibc, libstdc++, libgcc_s, libgomp, libatomic, zlib,
# the compiler, CMake, Ninja, CUDA, NCCL. A few system-ish libraries (libudev, libOpenCL) go into
# fallback-lib/, which env.sh puts on LD_LIBRARY_PATH only where the system lacks them.
# Use there: scripts/gpu-check.sh unpacks the archive and sources env.sh (see docs/gpus.md, "GPU check").
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=${1:-.gpu-bundle}
arch=x86_64-linux-gnu
name=shardlab-bundle

die() { echo "gpu-bundle: $*" >&2; exit 1; }
log() { echo "gpu-bundle: $*"; }
for tool in apt-get apt-cache dpkg-deb readelf tar xz find g++; do
  command -v "$tool" >/dev/null || die "'$tool' is missing (needs: apt, dpkg, binutils, tar, xz-utils, g++)"
done
[ "$(dpkg --print-architecture)" = amd64 ] || die "run on an amd64 Debian machine (this is $(dpkg --print-architecture))"

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
debs=$work/debs        # downloaded .deb files
cand=$work/cand        # each downloaded package unpacked, one directory per package
root=$work/$name       # the bundle's prefix (usr/, etc/, fallback-lib/, env.sh)
mkdir -p "$debs" "$cand" "$root"

# ---- apt: the system's package lists, or a private apt state when there are none (no root) ----
apt_opts=()
if ! apt-cache show openmpi-bin >/dev/null 2>&1; then
  log "no package lists on this system: updating a private apt state in $work/apt"
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
  touch "$work/apt/status"
  apt_opts=(-o "Dir::State=$work/apt" -o "Dir::State::Lists=$work/apt/lists" -o "Dir::State::status=$work/apt/status"
            -o "Dir::Cache=$work/apt/cache" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)")
  apt-get "${apt_opts[@]}" update -qq || die "apt-get update (private state) failed: is the network reachable?"
fi
[ "$(id -u)" -eq 0 ] && apt_opts+=(-o "APT::Sandbox::User=root")

# Direct Depends of a package (first alternative of each; virtual packages skipped).
deps_of() {
  apt-cache "${apt_opts[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "$1" 2>/dev/null | sed -n 's/^ *|\{0,1\}Depends: \([^<][^ ]*\)$/\1/p' | sed 's/:.*//' | sort -u
}
declare -A downloaded=()
# Downloads and unpacks packages (skipping those already here).
fetch() {
  local want=() p
  for p in "$@"; do [ -n "${downloaded[$p]:-}" ] || want+=("$p"); done
  [ ${#want[@]} -gt 0 ] || return 0
  if ! (cd "$debs" && apt-get "${apt_opts[@]}" download -qq "${want[@]}") 2> "$work/apt.err"; then
    cat "$work/apt.err" >&2
    die "apt-get download ${want[*]} failed"
  fi
  for p in "${want[@]}"; do
    local deb
    deb=$(ls "$debs/${p}"_*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || die "apt-get download did not produce a .deb for '$p'"
    mkdir -p "$cand/$p" && dpkg-deb -x "$deb" "$cand/$p"
    downloaded[$p]=1
  done
}

# ---- 1. content packages: shipped as a whole (then pruned) --------------------------------------
# The generic names resolve to versioned ones by following Depends within the same family.
declare -A content=()
add_family() {  # add_family PACKAGE REGEX: the package and its Depends (recursively) matching REGEX
  local p=$1 re=$2 d
  [ -n "${content[$p]:-}" ] && return 0
  content[$p]=1
  for d in $(deps_of "$p"); do [[ $d =~ $re ]] && add_family "$d" "$re"; done
  return 0
}
add_family openmpi-bin '^(openmpi-|libopenmpi)'
add_family libopenmpi-dev '^(openmpi-|libopenmpi)'
add_family libdnnl-dev '^libdnnl'
add_family libopenblas-openmp-dev '^libopenblas'
add_family libboost-program-options-dev '^libboost'
add_family catch2 '^catch2'
add_family nlohmann-json3-dev '^nlohmann'
add_family libfmt-dev '^libfmt'
log "content packages: ${!content[*]}"
fetch "${!content[@]}"
for p in "${!content[@]}"; do cp -a "$cand/$p/." "$root/"; done

# ---- 2. prune what a build-and-run does not need ------------------------------------------------
rm -rf "$root"/usr/share/{doc,doc-base,man,info,lintian,locale,bug,javascript,java}
rm -rf "$root/usr/lib/$arch/fortran" "$root/usr/lib/$arch/openmpi/lib/"*.mod
find "$root" \( -name '*.la' -o -name '*.jar' -o -name '*mpifh*' -o -name '*usempi*' \
  -o -name '*mpi_java*' -o -name 'mpijavac*' -o -name '*oshmem*' -o -name 'osh*' -o -name 'shmem*' \
  -o -name 'mpif77*' -o -name 'mpif90*' -o -name 'mpifort*' -o -name '*.tcl' \) -prune -exec rm -rf {} +
# Static libraries, except those a shipped CMake package config imports (Catch2's libCatch2WithMain.a:
# its Catch2Targets.cmake fails when the file is missing).
find "$root" -name '*.a' | while read -r a; do
  grep -rqF --include='*.cmake' "$(basename "$a")" "$root" || rm -f "$a"
done
# Boost: only the headers the project's includes pull in (gcc and clang, C++14/17/20), and all of
# boost/config (compiler- and library-specific branches).
boost_inc=$root/usr/include
if [ -d "$boost_inc/boost" ]; then
  mapfile -t boost_headers < <(grep -rhoE '#include <boost/[^>]+>' "$repo"/src "$repo"/tools "$repo"/benchmarks \
    "$repo"/tests "$repo"/shard "$repo"/memory "$repo"/optim 2>/dev/null | sed 's/#include <\(.*\)>/\1/' | sort -u)
  [ ${#boost_headers[@]} -gt 0 ] || boost_headers=(boost/program_options.hpp)
  tu=$work/boost_tu.cpp
  printf '#include <%s>\n' "${boost_headers[@]}" > "$tu"
  keep=$work/boost_keep
  : > "$keep"
  for cxx in g++ clang++; do
    command -v $cxx >/dev/null || continue
    for std in c++14 c++17 c++20; do
      $cxx -std=$std -M -I"$boost_inc" "$tu" 2>/dev/null | tr ' \\' '\n\n' | grep "^$boost_inc/boost/" >> "$keep" || true
    done
  done
  [ -s "$keep" ] || die "could not compute the Boost header closure of ${boost_headers[*]}"
  (cd "$boost_inc" && find boost/config -type f) | sed "s|^|$boost_inc/|" >> "$keep"
  sort -u "$keep" -o "$keep"
  mv "$boost_inc/boost" "$work/boost_all"
  while read -r f; do
    rel=${f#"$boost_inc/"}
    mkdir -p "$boost_inc/$(dirname "$rel")"
    cp -a "$work/boost_all/${rel#boost/}" "$boost_inc/$rel"
  done < "$keep"
  log "Boost headers: kept $(wc -l < "$keep") of $(find "$work/boost_all" -type f | wc -l) (closure of ${boost_headers[*]})"
fi

# ---- 3. shared-library closure ------------------------------------------------------------------
# Never bundled: what glibc and the compiler on the GPU machine provide.
base_re='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|libresolv\.so\.2|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libgomp\.so\.1|libatomic\.so\.1|libz\.so\.1)$'
# Bundled, but only used where the system has no copy of its own (env.sh decides).
fallback_pkgs=' libudev1 ocl-icd-libopencl1 '
# Optional ELFs: dlopen'ed components kept only when all they need is in the closure of the rest.
# mca_pmix_ext3x is not optional: Open MPI 4.1 talks to its ranks through the external PMIx.
is_optional() {
  case $1 in
    */mca_pmix_ext3x.so) return 1 ;;
    */openmpi/lib/openmpi3/*.so | */pmix2/lib/pmix/*.so | */libmca_common_*) return 0 ;;
  esac
  return 1
}
is_elf() { [ -f "$1" ] && [ ! -L "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
needed_of() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# Sonames available in the bundle (files and symlinks in any lib directory, by name).
bundle_sonames() { find "$root" \( -type f -o -type l \) -name 'lib*.so*' -printf '%f\n' | sort -u; }

mapfile -t all_elfs < <(find "$root" -type f | while read -r f; do is_elf "$f" && echo "$f"; done)
core=() optional=()
for f in "${all_elfs[@]}"; do if is_optional "$f"; then optional+=("$f"); else core+=("$f"); fi; done

declare -A lib_pkg_added=()
add_lib_from() {  # add_lib_from PACKAGE: its shared libraries (files + soname links) into the bundle
  local p=$1 dest rel
  if [[ $fallback_pkgs == *" $p "* ]]; then dest=$root/fallback-lib; else dest=$root/usr/lib/$arch; fi
  mkdir -p "$dest"
  while read -r rel; do
    case $rel in
      */pmix2/*) mkdir -p "$root/$(dirname "$rel")"; cp -a "$cand/$p/$rel" "$root/$rel" ;;  # keeps PMIx's layout
      *) cp -a "$cand/$p/$rel" "$dest/" ;;
    esac
  done < <(cd "$cand/$p" && find . \( -type f -o -type l \) -name 'lib*.so.*' ! -path './usr/share/*' | sed 's|^\./||')
  # PMIx's own plugins and help files come with it.
  if [ -d "$cand/$p/usr/lib/$arch/pmix2" ]; then
    cp -a "$cand/$p/usr/lib/$arch/pmix2" "$root/usr/lib/$arch/"
  fi
  lib_pkg_added[$p]=1
}
# The package (among those downloaded) whose files include SONAME.
provider_of() {
  local hit
  hit=$(cd "$cand" && find . -name "$1" \( -type f -o -type l \) ! -path '*/usr/share/*' 2>/dev/null | head -1)
  if [ -n "$hit" ]; then hit=${hit#./}; echo "${hit%%/*}"; fi
}

closure_of() {  # closure_of ELF...: adds packages until every NEEDED is in the bundle or the base
  local elfs=("$@") round=0
  while :; do
    round=$((round + 1))
    [ $round -lt 20 ] || die "library closure did not converge"
    local have missing=() so f p
    have=$(bundle_sonames)
    for f in "${elfs[@]}"; do
      for so in $(needed_of "$f"); do
        [[ $so =~ $base_re ]] && continue
        grep -qxF "$so" <<< "$have" || missing+=("$so")
      done
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    local unresolved=()
    for so in "${missing[@]}"; do
      p=$(provider_of "$so")
      if [ -n "$p" ]; then
        [ -n "${lib_pkg_added[$p]:-}" ] && die "package $p is in the bundle but has no $so"
        log "  $so <- $p"
        add_lib_from "$p"
      else
        unresolved+=("$so")
      fi
    done
    if [ ${#unresolved[@]} -gt 0 ]; then
      # Download the library Depends of every package so far (not the base ones) and look again.
      local more=() q
      for p in "${!content[@]}" "${!lib_pkg_added[@]}" "${!downloaded[@]}"; do
        for q in $(deps_of "$p"); do
          [[ $q =~ ^lib ]] || [[ $q =~ ^ocl-icd ]] || continue
          [[ $q =~ ^(libc6|libgcc-s1|libstdc\+\+6|zlib1g|libgomp1|libatomic1)$ ]] && continue
          [ -n "${downloaded[$q]:-}" ] || more+=("$q")
        done
      done
      mapfile -t more < <(printf '%s\n' "${more[@]}" | sort -u | grep . || true)
      [ ${#more[@]} -gt 0 ] || die "no Debian package found providing: ${unresolved[*]}"
      log "  looking for ${unresolved[*]} in: ${more[*]}"
      fetch "${more[@]}"
    fi
    # Newly added libraries need their own NEEDED resolved too.
    mapfile -t elfs < <(printf '%s\n' "${elfs[@]}"; find "$root/usr/lib/$arch" "$root/fallback-lib" -type f -name 'lib*.so*' 2>/dev/null \
      | while read -r f; do is_optional "$f" || { is_elf "$f" && echo "$f"; }; done)
    mapfile -t elfs < <(printf '%s\n' "${elfs[@]}" | sort -u)
  done
}
log "library closure of ${#core[@]} executables and libraries"
closure_of "${core[@]}"

# Optional components: keep those whose NEEDED are all in the bundle (or base), to a fixpoint.
declare -A kept=()
hidden=$work/hidden && mkdir -p "$hidden"
# Move optional files aside so that the "bundle sonames" are those of the core closure only.
for f in "${optional[@]}"; do mkdir -p "$hidden/$(dirname "${f#"$root"/}")"; mv "$f" "$hidden/${f#"$root"/}"; done
changed=1
while [ $changed -eq 1 ]; do
  changed=0
  have=$(bundle_sonames)
  for f in "${optional[@]}"; do
    [ -n "${kept[$f]:-}" ] && continue
    ok=1
    for so in $(needed_of "$hidden/${f#"$root"/}"); do
      [[ $so =~ $base_re ]] && continue
      grep -qxF "$so" <<< "$have" || { ok=0; break; }
    done
    if [ $ok -eq 1 ]; then mv "$hidden/${f#"$root"/}" "$f"; kept[$f]=1; changed=1; fi
  done
done
dropped=()
for f in "${optional[@]}"; do [ -n "${kept[$f]:-}" ] || dropped+=("$(basename "$f")"); done
log "components kept: ${#kept[@]}, dropped (need libraries outside the closure): ${dropped[*]:-none}"
# Symlinks left dangling by the pruning (e.g. libmca_common_ucx.so) go too.
find "$root" -xtype l -delete

# ---- 4. symlinks: relative inside the prefix, and the alternatives Debian's postinst would make --
find "$root" -type l -lname '/*' | while read -r l; do
  t=$(readlink "$l")
  ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$root$t")" "$l"
done
for w in mpirun mpiexec mpicc mpicxx mpic++ mpiCC; do
  [ -e "$root/usr/bin/$w.openmpi" ] && ln -sfn "$w.openmpi" "$root/usr/bin/$w"
done
[ -x "$root/usr/bin/mpirun" ] || die "the bundle has no usr/bin/mpirun (openmpi-bin unpacked wrongly?)"

# ---- 5. check: every NEEDED of every ELF resolves inside the bundle or the base --------------------
have=$(bundle_sonames)
bad=0
while read -r f; do
  is_elf "$f" || continue
  for so in $(needed_of "$f"); do
    [[ $so =~ $base_re ]] && continue
    grep -qxF "$so" <<< "$have" || { echo "gpu-bundle: ${f#"$root"/} needs $so, which is not in the bundle" >&2; bad=1; }
  done
done < <(find "$root" -type f)
[ $bad -eq 0 ] || die "library closure incomplete"

# ---- 6. env.sh ------------------------------------------------------------------------------------
cat > "$root/env.sh" <<'EOF'
# shardlab GPU bundle environment (written by scripts/gpu-bundle.sh). After unpacking bundle.tar.xz:
#   source P/env.sh            (P = the unpacked shardlab-bundle directory)
#   source DIR/env.sh P        (the copy beside the archive, P given)
# Sets PATH, LD_LIBRARY_PATH, CMAKE_PREFIX_PATH, Open MPI's and PMIx's
# relocation (OPAL_PREFIX & co.), and Open MPI's settings for one node as root in a container.
# SHARDLAB_BUNDLE_CMAKE_ARGS: the CMake options that point FindMPI at the bundle.
_sb=${1:-${SHARDLAB_BUNDLE:-}}
if [ -z "$_sb" ]; then _sb=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); fi
if [ ! -x "$_sb/usr/bin/orterun" ]; then
  echo "env.sh: '$_sb' is not an unpacked shardlab bundle (no usr/bin/orterun)" >&2
  return 1 2>/dev/null || exit 1
fi
_sb=$(cd "$_sb" && pwd)
_sb_lib=$_sb/usr/lib/x86_64-linux-gnu
export SHARDLAB_BUNDLE=$_sb
export PATH=$_sb/usr/bin${PATH:+:$PATH}
export LD_LIBRARY_PATH=$_sb_lib:$_sb_lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# fallback-lib (libudev, libOpenCL): last, and only when the system lacks one of them.
for _sb_so in "$_sb"/fallback-lib/lib*.so.[0-9]; do
  [ -e "$_sb_so" ] || continue
  if ! /sbin/ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*${_sb_so##*/} "; then
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$_sb/fallback-lib
    break
  fi
done
export CMAKE_PREFIX_PATH=$_sb/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
# Neither CPATH nor LIBRARY_PATH: CMake finds headers and libraries through CMAKE_PREFIX_PATH and
# mpicxx adds MPI's. CPATH would turn the -isystem directories into -I ones (their warnings
# printed under -Wall -Wpedantic); LIBRARY_PATH would make CMake take the bundle's lib directory for
# an implicit linker directory and leave it out of the binaries' RUNPATH.
# Open MPI 4.1 was configured with --prefix=/usr and every directory but sysconfdir relative to it
# (libdir ${prefix}/lib/x86_64-linux-gnu/openmpi/lib, pkgdatadir ${datadir}/openmpi): OPAL_PREFIX
# relocates components, help files and the mpicxx wrapper data; sysconfdir (/etc/openmpi) is absolute.
export OPAL_PREFIX=$_sb/usr
export OPAL_SYSCONFDIR=$_sb/etc/openmpi
# PMIx 4.2 was configured with absolute libdir and datadir (/usr/lib/x86_64-linux-gnu/pmix2/{lib,share}):
# each is relocated by its own variable (its plugins: pkglibdir, its help files: pkgdatadir).
export PMIX_PREFIX=$_sb_lib/pmix2 PMIX_EXEC_PREFIX=$_sb_lib/pmix2
export PMIX_LIBDIR=$_sb_lib/pmix2/lib PMIX_PKGLIBDIR=$_sb_lib/pmix2/lib/pmix
export PMIX_DATADIR=$_sb_lib/pmix2/share PMIX_PKGDATADIR=$_sb_lib/pmix2/share/pmix
# One node, as root, in a container: shared memory between ranks (no single-copy: CMA needs
# ptrace rights containers often lack), launches without ssh, out-of-band over loopback.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader
export OMPI_MCA_pml=ob1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_plm=isolated
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mca_base_component_show_load_errors=0
export SHARDLAB_BUNDLE_CMAKE_ARGS="-DMPI_CXX_COMPILER=$_sb/usr/bin/mpicxx -DMPIEXEC_EXECUTABLE=$_sb/usr/bin/mpiexec -DCMAKE_PREFIX_PATH=$_sb/usr"
unset _sb _sb_lib _sb_so
EOF

# Manifest: packages and versions.
{
  echo "# shardlab GPU bundle, built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  for p in $(printf '%s\n' "${!content[@]}" "${!lib_pkg_added[@]}" | sort -u); do
    echo "$p $(dpkg-deb -f "$(ls "$debs/${p}"_*.deb | head -1)" Version)"
  done
  echo "# dropped components: ${dropped[*]:-none}"
} > "$root/MANIFEST"

# ---- 7. pack --------------------------------------------------------------------------------------
mkdir -p "$out"
tar -C "$work" --owner=0 --group=0 --numeric-owner -cf - "$name" | xz -T0 -9e > "$out/bundle.tar.xz.part"
mv "$out/bundle.tar.xz.part" "$out/bundle.tar.xz"
cp "$root/env.sh" "$out/env.sh"
cp "$root/MANIFEST" "$out/MANIFEST"
log "packages: $(grep -vc '^#' "$out/MANIFEST"), unpacked $(du -sh "$root" | cut -f1)"
log "wrote $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)), $out/env.sh, $out/MANIFEST"
