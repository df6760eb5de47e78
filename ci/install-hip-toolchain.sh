#!/usr/bin/env bash
# install-hip-toolchain.sh -- private, pinned toolchain that compiles HIP (ROCm)
# device code on a CPU-only Debian 12 (bookworm) amd64 machine.
#
#   clang/lld 19.1.7 (bookworm)  +  HIP 7.2.4 headers (Debian experimental)
#   +  ROCm device libraries (trixie, LLVM-17 bitcode; clang 19 reads it)
#
# Nothing is installed system-wide: every .deb is fetched by exact pool path,
# checked against a pinned sha256 and unpacked with `dpkg-deb -x` into $PREFIX.
# Idempotent: a second run with the same pins only re-checks and prints.
#
# Env:
#   SGLPATCH_HIP_TOOLCHAIN  install root (default: hip-toolchain/ in sglpatch's cache,
#                           ${SGLPATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglpatch}), where the
#                           rocm-guard witness (sglpatch/witnesses/rocm_guard.py) looks for it
#   HIP_TOOLCHAIN_DEB_DIR where .debs are cached / may be pre-seeded (default $PREFIX/debs)
#   DEBIAN_MIRROR         default http://deb.debian.org/debian
#   HIP_TOOLCHAIN_NO_APT=1  never apt-get install missing bookworm runtime libs; fail instead
#
# Output: $PREFIX/env.sh defines HIP_CLANGXX, HIP_ROCM_PATH, HIP_TOOLCHAIN_PREFIX.
set -euo pipefail

PREFIX="${SGLPATCH_HIP_TOOLCHAIN:-${SGLPATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglpatch}/hip-toolchain}"
DEB_DIR="${HIP_TOOLCHAIN_DEB_DIR:-$PREFIX/debs}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# package|version|pool path|sha256|tar members to extract ("" = whole package)
PINS=(
"libllvm19|1:19.1.7-3~deb12u1|pool/main/l/llvm-toolchain-19/libllvm19_19.1.7-3~deb12u1_amd64.deb|6edf3a8b28495cdba883d9760e0dca1a81983fc497a5f989dc64d0d96d23b4aa|"
"libclang-cpp19|1:19.1.7-3~deb12u1|pool/main/l/llvm-toolchain-19/libclang-cpp19_19.1.7-3~deb12u1_amd64.deb|5daa784e1d747db320c16604729ffa805e6bfd72d3ac0b7cb0ee5f1a7ebc8aae|"
"clang-19|1:19.1.7-3~deb12u1|pool/main/l/llvm-toolchain-19/clang-19_19.1.7-3~deb12u1_amd64.deb|89ab931a9bbfd567a76df3141af5d5ec67b01d800150e614f2c9bf4671da9b08|"
"libclang-common-19-dev|1:19.1.7-3~deb12u1|pool/main/l/llvm-toolchain-19/libclang-common-19-dev_19.1.7-3~deb12u1_amd64.deb|811c2d398ad772204ec05ffde485cbbc4c210abc5dcf0068ff9ca3e647591ce7|"
"lld-19|1:19.1.7-3~deb12u1|pool/main/l/llvm-toolchain-19/lld-19_19.1.7-3~deb12u1_amd64.deb|416e084363a16a7060eaa6343ed641dfe864b8208c39170ee00a5679e4b486a2|"
"clang-tools-19|1:19.1.7-3~deb12u1|pool/main/l/llvm-toolchain-19/clang-tools-19_19.1.7-3~deb12u1_amd64.deb|5188563c2e08cba6e8e5d253e03bfc0a01e112eba1d8939f97d2e6ce35218491|./usr/lib/llvm-19/bin/clang-offload-bundler"
"libamdhip64-dev|7.2.4-1~exp2|pool/main/r/rocm-hipamd/libamdhip64-dev_7.2.4-1~exp2_amd64.deb|28ae316c5be2d33b53fae8f2151e76a758f84aa3493abafeaef935e49cc5ba07|./usr/include/hip ./usr/share/hip"
"rocm-device-libs-17|6.0+git20231212.5a852ed-2|pool/main/r/rocm-device-libs/rocm-device-libs-17_6.0+git20231212.5a852ed-2_amd64.deb|fa10f0f5be5269c715492e4e3d3816f956a4d8b9098443d54052d351cfda9213|./usr/lib/llvm-17/lib/clang/17/amdgcn"
)

log() { printf '[hip-toolchain] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "only x86_64 is supported (got $(uname -m))"
for t in dpkg-deb sha256sum tar; do command -v "$t" >/dev/null || die "missing tool: $t"; done
if command -v curl >/dev/null; then fetch() { curl -fsSL --retry 3 -o "$2" "$1"; }
elif command -v wget >/dev/null; then fetch() { wget -q -O "$2" "$1"; }
else die "need curl or wget"; fi

STAMP_WANT="$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-16)"
ROOT="$PREFIX/root"
CLANGXX="$ROOT/usr/lib/llvm-19/bin/clang++"
ROCM="$PREFIX/rocm"

smoke_test() {
  local d; d="$(mktemp -d)"
  printf '%s\n' '#include <hip/hip_runtime.h>' \
    '__global__ void k(float* p){ p[threadIdx.x] = __builtin_sqrtf(p[threadIdx.x]); }' \
    'int main(){ float* p=nullptr; hipLaunchKernelGGL(k, dim3(1), dim3(64), 0, 0, p); return 0; }' > "$d/t.hip"
  "$CLANGXX" -x hip --rocm-path="$ROCM" -I"$ROCM/include" --offload-arch=gfx942 \
    -D__HIP_PLATFORM_AMD__=1 -O2 -c "$d/t.hip" -o "$d/t.o" 2> "$d/err" \
    || { cat "$d/err" >&2; rm -rf "$d"; return 1; }
  rm -rf "$d"
}

print_summary() {
  log "prefix:       $PREFIX"
  log "clang++:      $CLANGXX ($("$CLANGXX" --version | head -1))"
  log "rocm-path:    $ROCM (HIP $(sed -n 's/^#define HIP_VERSION_MAJOR //p;s/^#define HIP_VERSION_MINOR //p' "$ROCM/include/hip/hip_version.h" | paste -sd.))"
  log "device libs:  $ROCM/amdgcn/bitcode ($(ls "$ROCM/amdgcn/bitcode" | wc -l) files)"
  log "env file:     $PREFIX/env.sh"
  local p; for p in "${PINS[@]}"; do IFS='|' read -r n v _ s _ <<<"$p"; log "  $n $v sha256=$s"; done
}

if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$STAMP_WANT" ] && [ -x "$CLANGXX" ]; then
  if smoke_test; then log "already installed (stamp $STAMP_WANT)"; print_summary; exit 0; fi
  log "stamp present but smoke test failed; reinstalling"
fi

mkdir -p "$DEB_DIR"
STAGE="$PREFIX/root.tmp.$$"
rm -rf "$STAGE"; mkdir -p "$STAGE"
trap 'rm -rf "$STAGE"' EXIT

for p in "${PINS[@]}"; do
  IFS='|' read -r name ver path sha members <<<"$p"
  deb="$DEB_DIR/$(basename "$path")"
  if [ -f "$deb" ] && echo "$sha  $deb" | sha256sum -c --status; then
    log "cached   $name $ver"
  else
    log "download $name $ver"
    fetch "$MIRROR/$path" "$deb.part" || die "download failed: $MIRROR/$path (pin gone from the mirror? pre-seed $DEB_DIR)"
    echo "$sha  $deb.part" | sha256sum -c --status \
      || { rm -f "$deb.part"; die "sha256 mismatch for $name ($path)"; }
    mv "$deb.part" "$deb"
  fi
  if [ -z "$members" ]; then
    dpkg-deb -x "$deb" "$STAGE"
  else
    # shellcheck disable=SC2086
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$STAGE" $members
  fi
done

# clang/lld/bundler have RUNPATH $ORIGIN/../lib; libLLVM lives in the multiarch dir.
ln -sfn ../../x86_64-linux-gnu/libLLVM.so.19.1 "$STAGE/usr/lib/llvm-19/lib/libLLVM.so.19.1"

rm -rf "$ROOT"; mv "$STAGE" "$ROOT"; trap - EXIT

# A ROCm-shaped tree for clang's --rocm-path: include/hip, share/hip/version, amdgcn/bitcode.
rm -rf "$ROCM"; mkdir -p "$ROCM"
ln -sfn ../root/usr/include "$ROCM/include"
ln -sfn ../root/usr/share "$ROCM/share"
ln -sfn ../root/usr/lib/llvm-17/lib/clang/17/amdgcn "$ROCM/amdgcn"

# Runtime libs of libLLVM/clang come from bookworm itself; add any that are missing.
missing_pkgs=()
for bin in "$CLANGXX" "$ROOT/usr/lib/llvm-19/bin/lld" "$ROOT/usr/lib/llvm-19/bin/clang-offload-bundler"; do
  while read -r lib; do
    case "$lib" in
      libz3.so.4) missing_pkgs+=(libz3-4) ;; libxml2.so.2) missing_pkgs+=(libxml2) ;;
      libedit.so.2) missing_pkgs+=(libedit2) ;; libffi.so.8) missing_pkgs+=(libffi8) ;;
      libzstd.so.1) missing_pkgs+=(libzstd1) ;; libtinfo.so.6) missing_pkgs+=(libtinfo6) ;;
      libz.so.1) missing_pkgs+=(zlib1g) ;; libicuuc.so.72|libicudata.so.72) missing_pkgs+=(libicu72) ;;
      libbsd.so.0) missing_pkgs+=(libbsd0) ;; libmd.so.0) missing_pkgs+=(libmd0) ;;
      *) missing_pkgs+=("?$lib") ;;
    esac
  done < <(ldd "$bin" | awk '/not found/{print $1}')
done
# clang uses the system GCC's libstdc++ headers and glibc headers for the host side.
[ -d /usr/include/c++/12 ] || missing_pkgs+=(libstdc++-12-dev)
[ -f /usr/include/stdio.h ] || missing_pkgs+=(libc6-dev)
if [ "${#missing_pkgs[@]}" -gt 0 ]; then
  mapfile -t missing_pkgs < <(printf '%s\n' "${missing_pkgs[@]}" | sort -u)
  log "missing bookworm runtime packages: ${missing_pkgs[*]}"
  printf '%s\n' "${missing_pkgs[@]}" | grep -q '^?' && die "unmapped missing libraries"
  [ "${HIP_TOOLCHAIN_NO_APT:-0}" = 1 ] && die "HIP_TOOLCHAIN_NO_APT=1; install them first"
  [ "$(id -u)" = 0 ] || die "need root to apt-get install ${missing_pkgs[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}"
fi

cat > "$PREFIX/env.sh" <<EOF
export HIP_TOOLCHAIN_PREFIX='$PREFIX'
export HIP_CLANGXX='$CLANGXX'
export HIP_ROCM_PATH='$ROCM'
EOF

smoke_test || die "smoke test (tiny HIP kernel for gfx942) failed"
echo "$STAMP_WANT" > "$PREFIX/.stamp"
log "installed (stamp $STAMP_WANT)"
print_summary
