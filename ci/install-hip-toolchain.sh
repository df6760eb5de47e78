#!/usr/bin/env bash
# install-hip-toolchain.sh -- a private, pinned toolchain that compiles HIP (ROCm) device code for
# gfx942 (MI300X) and gfx950 (MI355X) on a CPU-only x86_64 Linux machine, for the rocm-guard witness
# (sglpatch/witnesses/rocm_guard.py).
#
#   clang/lld 22.1.8 (Debian trixie)  +  HIP 7.2.4 headers (Debian experimental)
#   +  ROCm 7.2.4 device libraries built for LLVM 22 (Debian experimental, gfx950 bitcode included)
#   +  trixie's glibc 2.41, libstdc++ 14 and the other runtime libraries clang links
#   +  trixie's libstdc++/glibc/kernel headers as the host side's sysroot
#
# Why this compiler: gfx950 needs LLVM 20 or later. Tried, in order:
#   - Debian bookworm (this machine's release) and bookworm-backports: newest is llvm-toolchain-19,
#     which rejects gfx950 ("unsupported CUDA/HIP gpu arch").
#   - Debian trixie: llvm-toolchain-22 (chosen; its stable pool also has the runtime libraries);
#     trixie-backports has 21, sid 21-23, experimental 24. Their binaries need glibc >= 2.38
#     (bookworm has 2.36), so trixie's own loader, glibc and libstdc++ are unpacked beside them
#     and each binary is pointed at them with patchelf (trixie's, run through that same loader).
#   - The package index (`pip download --no-deps`): rocm, rocm-sdk-core and rocm-sdk-devel have
#     no installable file; rocm-llvm-python ships ROCm's LLVM as a C-API library and Comgr
#     bindings, no clang driver, lld or offload bundler; clang-tool-chain-bins downloads its
#     binaries from elsewhere at run time; clang/libclang are bindings; clang-format/clang-tidy
#     ship single tools. ziglang embeds a clang, but not as the HIP driver with ld.lld and
#     clang-offload-bundler beside it, and it is not the compiler anyone builds sglang with.
#   - ROCm's own LLVM (amd-llvm / rocm-llvm): not on any registry reachable here (only the
#     package index, Debian and npm are).
#
# Nothing is installed system-wide and no root is needed: every .deb is fetched by exact pool path
# from the Debian mirror of apt's own configuration, checked against a pinned sha256 and unpacked
# with `dpkg-deb -x` into $PREFIX/clang-22. The binaries carry absolute paths to that folder, so it
# is not relocatable: move the cache and run this again. Idempotent: with the same pins and prefix a
# second run only re-checks and prints. Parallel runs wait for each other (flock).
#
# Env:
#   SGLPATCH_HIP_TOOLCHAIN  install root (default: hip-toolchain/ in sglpatch's cache,
#                           ${SGLPATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglpatch}); the
#                           toolchain goes to its clang-22/ folder, where the witness looks
#   HIP_TOOLCHAIN_DEB_DIR   where .debs are cached / may be pre-seeded (default $PREFIX/debs)
#   SGLPATCH_DEBIAN_MIRROR  the Debian archive to fetch from (also DEBIAN_MIRROR); default: the
#                           URI that apt's sources (sources.list, sources.list.d/*.list and
#                           *.sources, as apt-config names them) give for the Debian archive
#   HIP_TOOLCHAIN_TIMEOUT   seconds one download may take (default 600)
#
#   install-hip-toolchain.sh --print-mirror   prints the mirror it would use, and exits
#
# Output: $PREFIX/clang-22/toolchain.json (stamp, clang++, rocm path, verified arches) and env.sh.
set -euo pipefail

PREFIX="${SGLPATCH_HIP_TOOLCHAIN:-${SGLPATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglpatch}/hip-toolchain}"
DEST="$PREFIX/clang-22"
DEB_DIR="${HIP_TOOLCHAIN_DEB_DIR:-$PREFIX/debs}"
FETCH_TIMEOUT="${HIP_TOOLCHAIN_TIMEOUT:-600}"
LAYOUT=1 # bump when the unpacking below changes, so an old install is not taken for a new one
ARCHES=(gfx942 gfx950)

# package|version|pool path|sha256|tar members to extract ("" = whole package)
# From trixie (Debian 13) unless marked: llvm-toolchain-22 and what it needs at run time.
PINS=(
"clang-22|1:22.1.8-1~deb13u5|pool/main/l/llvm-toolchain-22/clang-22_22.1.8-1~deb13u5_amd64.deb|6f6b7f4f6974a2754e6ebf7f8e6286e66cdea062da5e7066adc3a8a44a134f15|"
"libclang-cpp22|1:22.1.8-1~deb13u5|pool/main/l/llvm-toolchain-22/libclang-cpp22_22.1.8-1~deb13u5_amd64.deb|2113dcb400bbfebbeb4b2effc2238fde16216383218a7de9f5a0c7763030507b|"
"libllvm22|1:22.1.8-1~deb13u5|pool/main/l/llvm-toolchain-22/libllvm22_22.1.8-1~deb13u5_amd64.deb|2b299d0615054df8cf0bd9f99b51bad1c4595ee4fa6cda61c060176f90950566|"
"libclang-common-22-dev|1:22.1.8-1~deb13u5|pool/main/l/llvm-toolchain-22/libclang-common-22-dev_22.1.8-1~deb13u5_amd64.deb|80d285cb01e065ffd5bd077c1194ffe16097a93a18bb3924cdb84ea4ebb998aa|"
"lld-22|1:22.1.8-1~deb13u5|pool/main/l/llvm-toolchain-22/lld-22_22.1.8-1~deb13u5_amd64.deb|b1ff5fbc2be90441acdef25a3caab7f31049a9e3f1997362596904615a0b97da|"
"clang-tools-22|1:22.1.8-1~deb13u5|pool/main/l/llvm-toolchain-22/clang-tools-22_22.1.8-1~deb13u5_amd64.deb|f8a0c6b3a604113d17e3953fe6bbb43ad2554a33afc118cfb99037200f36c2a8|./usr/lib/llvm-22/bin/clang-offload-bundler"
"libc6|2.41-12+deb13u5|pool/main/g/glibc/libc6_2.41-12+deb13u5_amd64.deb|b59b0625cd1a791375d40dab23a4d5d3d0641e3d0a773501becdc3725b7f99cf|"
"libgcc-s1|14.2.0-19|pool/main/g/gcc-14/libgcc-s1_14.2.0-19_amd64.deb|3c71917b490d1a17aed43196a2787a256ecf060526cdb20216a74bedc061b150|"
"libstdc++6|14.2.0-19|pool/main/g/gcc-14/libstdc++6_14.2.0-19_amd64.deb|ab1fa05837aa7a92aae748fd07a18a35f7d18bb4a71c4724fe2bbf0e32089de0|"
"libzstd1|1.5.7+dfsg-1|pool/main/libz/libzstd/libzstd1_1.5.7+dfsg-1_amd64.deb|2f6a2aeacfc925eba8b00ac9139bc4bfccf8cacb09eb93de067074b26948eef9|"
"zlib1g|1:1.3.dfsg+really1.3.1-1+deb13u1|pool/main/z/zlib/zlib1g_1.3.dfsg+really1.3.1-1+deb13u1_amd64.deb|8c27c342230503b73dfde629642c3b352e87b554e06d60cf58772f236a305ceb|"
"libxml2|2.12.7+dfsg+really2.9.14-2.1+deb13u3|pool/main/libx/libxml2/libxml2_2.12.7+dfsg+really2.9.14-2.1+deb13u3_amd64.deb|e0c6b63ce4602a036a526f60fe5e6c1586710688058d98fc1001b9b3147b7efd|"
"libz3-4|4.13.3-1|pool/main/z/z3/libz3-4_4.13.3-1_amd64.deb|71383373523ef62d47eccf660cf6535c3febcbb3f88e54cb7a43124014b57359|"
"libedit2|3.1-20250104-1|pool/main/libe/libedit/libedit2_3.1-20250104-1_amd64.deb|b002ea172b9c1e34a67bc497c523c67bb74c3f0a4e98113cb083990a1f1d3bfe|"
"libffi8|3.4.8-2|pool/main/libf/libffi/libffi8_3.4.8-2_amd64.deb|0ebdc340de33333639c3c63874cd4b15ac2e83dfa1ef3053b7eefaf4919f4f68|"
"liblzma5|5.8.1-1+deb13u2|pool/main/x/xz-utils/liblzma5_5.8.1-1+deb13u2_amd64.deb|b38acab30f295bf1066a6632e31cbd0a1980f2924b38040cda131d5dea5384ec|"
"libbsd0|0.12.2-2|pool/main/libb/libbsd/libbsd0_0.12.2-2_amd64.deb|e5a85986fa6bec3307ab1bc860736b478b331882bc45e17675a7bdf88eecb43a|"
"libtinfo6|6.5+20250216-2|pool/main/n/ncurses/libtinfo6_6.5+20250216-2_amd64.deb|8b9f6a7983e9418564e48a627518de4c03917b56efe68d7f3e93bd8fffa1cc10|"
"libmd0|1.1.0-2+b1|pool/main/libm/libmd/libmd0_1.1.0-2+b1_amd64.deb|7244ec3839b61fac0c1884fe08aaa040f26e8f1f35f1f5d3482eacefd30d1b44|"
"patchelf|0.18.0-1.4|pool/main/p/patchelf/patchelf_0.18.0-1.4_amd64.deb|1d39a7973504a4a5eb4101293cca142b83055a5a0f94e1d4286ded2563289b92|./usr/bin/patchelf"
"libstdc++-14-dev|14.2.0-19|pool/main/g/gcc-14/libstdc++-14-dev_14.2.0-19_amd64.deb|4b962fac5f1af0bd8b1b3f97e0f47b9d8e9a79e88802143f00ebfbd78ad87a7b|"
"libgcc-14-dev|14.2.0-19|pool/main/g/gcc-14/libgcc-14-dev_14.2.0-19_amd64.deb|ca6f2d36d96b19b3eb71405b0b80134d8c89380b02204a2512e5c58ceb090628|"
"libc6-dev|2.41-12+deb13u5|pool/main/g/glibc/libc6-dev_2.41-12+deb13u5_amd64.deb|858f4d477cc39324f3c6582cdebcf38928fb385bb17b40518c77a7dccd296428|"
"linux-libc-dev|6.12.107-1|pool/main/l/linux/linux-libc-dev_6.12.107-1_all.deb|dc68dd53c7356598d005866da0d19d7bd33af2a62971aced624cdf04492902b4|"
# experimental: Debian's ROCm 7.2.4, built against llvm-toolchain-22
"libamdhip64-dev|7.2.4-1~exp2|pool/main/r/rocm-hipamd/libamdhip64-dev_7.2.4-1~exp2_amd64.deb|28ae316c5be2d33b53fae8f2151e76a758f84aa3493abafeaef935e49cc5ba07|./usr/include/hip ./usr/share/hip"
"rocm-device-libs-22|7.2.4+dfsg-1~exp1|pool/main/r/rocm-llvm/rocm-device-libs-22_7.2.4+dfsg-1~exp1_amd64.deb|24b439be7c151ff67bc1f4f4f42a7c4047b3e6fd7905b9e6df89c0fa5dea8031|./usr/lib/llvm-22/lib/clang/22/amdgcn"
)

log() { printf '[hip-toolchain] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# -- the Debian mirror, from apt's own configuration -----------------------------------------------

# Debian's release names; a sources entry for one of them (or its -updates/-backports, not
# -security, which carries no pool of ours) serves the Debian archive.
DEBIAN_SUITES=" buster bullseye bookworm trixie forky duke sid oldoldstable oldstable stable testing unstable experimental "

apt_source_files() {
  local list="" parts=""
  if command -v apt-config >/dev/null; then
    eval "$(apt-config shell list Dir::Etc::sourcelist/f parts Dir::Etc::sourceparts/d 2>/dev/null)"
  fi
  list="${list:-/etc/apt/sources.list}"; parts="${parts:-/etc/apt/sources.list.d/}"
  [ -f "$list" ] && printf '%s\n' "$list"
  local f; for f in "$parts"/*.list "$parts"/*.sources; do [ -f "$f" ] && printf '%s\n' "$f"; done
  return 0
}

# "URI SUITE" for every binary (deb) entry of one sources file, one-line or deb822 format.
apt_entries() {
  case "$1" in
    *.sources)
      awk 'function flush() { if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no") {
               n = split(uris, u, " "); m = split(suites, s, " ");
               for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) print u[i], s[j] }
             types = uris = suites = enabled = "" }
           /^[ \t]*#/ { next }
           /^[ \t]*$/ { flush(); next }
           { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
             if (key == "types") types = $0; else if (key == "uris") uris = $0
             else if (key == "suites") suites = $0; else if (key == "enabled") enabled = $0 }
           END { flush() }' "$1" ;;
    *)
      awk '/^[ \t]*deb[ \t]/ { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                               if (i + 1 <= NF) print $i, $(i + 1) }' "$1" ;;
  esac
}

debian_mirror() {
  if [ -n "${SGLPATCH_DEBIAN_MIRROR:-}" ]; then printf '%s\n' "${SGLPATCH_DEBIAN_MIRROR%/}"; return; fi
  if [ -n "${DEBIAN_MIRROR:-}" ]; then printf '%s\n' "${DEBIAN_MIRROR%/}"; return; fi
  local file uri suite base files=()
  mapfile -t files < <(apt_source_files)
  for file in "${files[@]}"; do
    while read -r uri suite; do
      case "$uri" in http://*|https://*|file:/*|ftp://*) ;; *) continue ;; esac
      case "$suite" in *-security|*/updates) continue ;; esac
      case "$suite" in
        *-proposed-updates) base="${suite%-proposed-updates}" ;; *-updates) base="${suite%-updates}" ;;
        *-backports) base="${suite%-backports}" ;; *) base="$suite" ;;
      esac
      case "$DEBIAN_SUITES" in *" $base "*) printf '%s\n' "${uri%/}"; return ;; esac
    done < <(apt_entries "$file")
  done
  die "no Debian archive in apt's sources (${files[*]:-none found}); set SGLPATCH_DEBIAN_MIRROR"
}

if [ "${1:-}" = "--print-mirror" ]; then debian_mirror; exit 0; fi
[ $# -eq 0 ] || die "usage: $0 [--print-mirror]"

# -- install ---------------------------------------------------------------------------------------

[ "$(uname -m)" = x86_64 ] || die "only x86_64 is supported (got $(uname -m))"
for t in dpkg-deb sha256sum tar timeout flock; do command -v "$t" >/dev/null || die "missing tool: $t"; done
case "$DEST" in *[\"\\]*) die "the install root may not contain quotes or backslashes: $DEST" ;; esac
if command -v curl >/dev/null; then
  fetch() { curl -fsSL --retry 3 --connect-timeout 30 --max-time "$FETCH_TIMEOUT" -o "$2" "$1"; }
elif command -v wget >/dev/null; then
  fetch() { timeout "$FETCH_TIMEOUT" wget -q --timeout=30 --tries=3 -O "$2" "$1"; }
else die "need curl or wget"; fi

STAMP_WANT="$( { printf '%s\n' "${PINS[@]}"; echo "layout $LAYOUT $DEST"; } | sha256sum | cut -c1-16)"
ROOT="$DEST/root"
LIBDIR="$ROOT/usr/lib/x86_64-linux-gnu"
LDSO="$LIBDIR/ld-linux-x86-64.so.2"
LLVM_BIN="$ROOT/usr/lib/llvm-22/bin"
CLANGXX="$LLVM_BIN/clang++"
ROCM="$DEST/rocm"

# run STEP SECONDS CMD...: CMD, killed after SECONDS, dying with a message that names STEP.
run() {
  local step="$1" seconds="$2"; shift 2
  local rc=0; timeout "$seconds" "$@" || rc=$?
  [ "$rc" -eq 124 ] && die "$step did not finish within ${seconds}s"
  [ "$rc" -eq 0 ] || die "$step failed (exit $rc)"
}

smoke_test() {
  local d arch; d="$(mktemp -d)"
  printf '%s\n' '#include <hip/hip_runtime.h>' '#include <vector>' \
    '__global__ void k(float* p){ p[threadIdx.x] = __builtin_sqrtf(p[threadIdx.x]); }' \
    'int main(){ std::vector<float> v(64); hipLaunchKernelGGL(k, dim3(1), dim3(64), 0, 0, v.data()); return 0; }' > "$d/t.hip"
  for arch in "${ARCHES[@]}"; do
    timeout 300 "$CLANGXX" --sysroot="$ROOT" -x hip --rocm-path="$ROCM" -I"$ROCM/include" --offload-arch="$arch" \
      -D__HIP_PLATFORM_AMD__=1 -O2 -c "$d/t.hip" -o "$d/t-$arch.o" 2> "$d/err" \
      || { log "smoke test for $arch failed:"; cat "$d/err" >&2; rm -rf "$d"; return 1; }
  done
  rm -rf "$d"
  # Hermetic: nothing clang, lld or the bundler loads may come from the host.
  local bin leaked
  for bin in clang lld clang-offload-bundler; do
    leaked="$(timeout 60 "$LDSO" --list "$LLVM_BIN/$bin" | grep -v -F -e "$ROOT" -e linux-vdso || true)"
    [ -z "$leaked" ] || { log "$bin loads host libraries: $leaked"; return 1; }
  done
}

print_summary() {
  log "prefix:       $DEST"
  log "clang++:      $CLANGXX ($(timeout 60 "$CLANGXX" --version | head -1))"
  log "rocm-path:    $ROCM (HIP $(sed -n 's/^#define HIP_VERSION_MAJOR //p;s/^#define HIP_VERSION_MINOR //p' "$ROCM/include/hip/hip_version.h" | paste -sd.))"
  log "device libs:  $ROCM/amdgcn/bitcode ($(ls "$ROCM/amdgcn/bitcode" | wc -l) files)"
  log "arches:       ${ARCHES[*]}"
  log "manifest:     $DEST/toolchain.json"
  local p; for p in "${PINS[@]}"; do IFS='|' read -r n v _ s _ <<<"$p"; log "  $n $v sha256=$s"; done
}

installed() {
  [ -f "$DEST/.stamp" ] && [ "$(cat "$DEST/.stamp")" = "$STAMP_WANT" ] && [ -x "$CLANGXX" ] && [ -f "$DEST/toolchain.json" ]
}

mkdir -p "$PREFIX" "$DEB_DIR"
exec 9>"$PREFIX/.install.lock"
if ! flock -n 9; then
  log "another install holds $PREFIX/.install.lock; waiting up to 1800s"
  flock -w 1800 9 || die "gave up waiting for $PREFIX/.install.lock after 1800s"
fi

if installed; then
  if smoke_test; then log "already installed (stamp $STAMP_WANT)"; print_summary; exit 0; fi
  log "stamp present but smoke test failed; reinstalling"
fi

MIRROR="$(debian_mirror)"
log "Debian mirror: $MIRROR"
STAGE="$DEST.tmp.$$"
rm -rf "$STAGE"; mkdir -p "$STAGE/root"
trap 'rm -rf "$STAGE"' EXIT

for p in "${PINS[@]}"; do
  IFS='|' read -r name ver path sha members <<<"$p"
  deb="$DEB_DIR/$(basename "$path")"
  if [ -f "$deb" ] && echo "$sha  $deb" | sha256sum -c --status; then
    log "cached   $name $ver"
  else
    log "download $name $ver"
    fetch "$MIRROR/$path" "$deb.part.$$" \
      || { rm -f "$deb.part.$$"; die "download failed or took over ${FETCH_TIMEOUT}s: $MIRROR/$path (pin gone from the mirror? pre-seed $DEB_DIR)"; }
    echo "$sha  $deb.part.$$" | sha256sum -c --status \
      || { rm -f "$deb.part.$$"; die "sha256 mismatch for $name: $MIRROR/$path is not the pinned file"; }
    mv "$deb.part.$$" "$deb"
  fi
  if [ -z "$members" ]; then
    run "dpkg-deb -x $(basename "$deb")" 300 dpkg-deb -x "$deb" "$STAGE/root"
  else
    # shellcheck disable=SC2086
    run "unpacking $members from $(basename "$deb")" 300 \
      bash -o pipefail -c 'dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" ${@:3}' _ "$deb" "$STAGE/root" $members
  fi
done

# Point every binary and every library that names its own search path at the private loader and
# libraries, by their final paths (absolute: a loader path cannot be relative).
SLIB="$STAGE/root/usr/lib/x86_64-linux-gnu"
patchelf() { run "patchelf $*" 60 "$SLIB/ld-linux-x86-64.so.2" --library-path "$SLIB" "$STAGE/root/usr/bin/patchelf" "$@"; }
for bin in clang lld clang-offload-bundler; do
  patchelf --set-interpreter "$LDSO" --force-rpath --set-rpath "$LIBDIR" "$STAGE/root/usr/lib/llvm-22/bin/$bin"
done
for lib in "$SLIB"/libLLVM.so.22.1 "$SLIB"/libclang-cpp.so.22.1; do
  patchelf --force-rpath --set-rpath "$LIBDIR" "$lib"
done

# A ROCm-shaped tree for clang's --rocm-path, holding only what /opt/rocm would:
# include/hip, share/hip (the version file), amdgcn/bitcode.
mkdir -p "$STAGE/rocm/include" "$STAGE/rocm/share"
ln -sfn ../../root/usr/include/hip "$STAGE/rocm/include/hip"
ln -sfn ../../root/usr/share/hip "$STAGE/rocm/share/hip"
ln -sfn ../root/usr/lib/llvm-22/lib/clang/22/amdgcn "$STAGE/rocm/amdgcn"

LLVM_VERSION="$(timeout 60 dpkg-deb -f "$DEB_DIR/$(basename "$(printf '%s\n' "${PINS[0]}" | cut -d'|' -f3)")" Version)"
arches_json="$(printf '"%s", ' "${ARCHES[@]}")"
cat > "$STAGE/toolchain.json" <<EOF
{"stamp": "$STAMP_WANT", "clangxx": "$CLANGXX", "rocm_path": "$ROCM", "sysroot": "$ROOT", "llvm": "$LLVM_VERSION", "arches": [${arches_json%, }]}
EOF
cat > "$STAGE/env.sh" <<EOF
export HIP_TOOLCHAIN_PREFIX='$DEST'
export HIP_CLANGXX='$CLANGXX'
export HIP_ROCM_PATH='$ROCM'
export HIP_SYSROOT='$ROOT'
EOF

rm -rf "$DEST"; mv "$STAGE" "$DEST"; trap - EXIT

smoke_test || die "smoke test (tiny HIP kernel for ${ARCHES[*]}) failed"
echo "$STAMP_WANT" > "$DEST/.stamp"
log "installed (stamp $STAMP_WANT)"
print_summary
