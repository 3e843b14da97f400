#!/usr/bin/env bash
# make install / make uninstall, as a user's project sees them: a tiny program built
# out of tree against the installed copy with CMake (find_package(ddp CONFIG) and the
# ddp::ddp target) and with pkg-config (ddp.pc), run as 3 ranks with its own --nproc
# and as 2 under the installed ddprun; then uninstall leaves nothing behind. Once into
# a PREFIX, once into a DESTDIR staging tree as packagers do.
cd "$(dirname "$0")/.." || exit 1
unset MAKEFLAGS MFLAGS MAKELEVEL # a make of our own, not a job of the caller's
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
pass() { echo "PASS install.$1"; }
failed() { echo "FAIL install.$1: $2"; fail=1; }
log() { head -c 400 "$tmp/log" | tr '\n' ' '; }
err() { [ -s "$tmp/err" ] && echo "stderr: $(head -c 300 "$tmp/err" | tr '\n' ' ')"; }
want_files="bin/ddprun include/ddp.h include/ddp_kernels.cuh share/cmake/ddp/ddpConfig.cmake share/cmake/ddp/ddpConfigVersion.cmake share/pkgconfig/ddp.pc"

version=$(sed -n 's/^#define DDP__VERSION "\(.*\)"$/\1/p' ddp.h) # what ddp.pc and CMake must say
mkdir -p "$tmp/src"
cat > "$tmp/src/consumer.c" <<'C'
#define DDP_IMPLEMENTATION
#include <ddp.h>
#include <ddp_kernels.cuh>
#include <math.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int status = ddp_launch(&argc, argv);
    ddp_ctx ctx;
    double x;
    if (status != DDP_WORKER) return status;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 1;
    x = sqrt((double)(ctx.rank + 1) * (ctx.rank + 1)); /* libm, as the kernels' CPU half needs */
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F64, DDP_SUM, NULL) != DDP_OK) return 1;
    ddp_print(&ctx, "sum %g over %d ranks\n", x, ctx.world_size);
    ddp_destroy(&ctx);
    return 0;
}
C
cat > "$tmp/src/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.13)
project(consumer C)
find_package(ddp $version CONFIG REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE ddp::ddp)
CM

# files under $1, relative, sorted, on one line
files() { (cd "$1" 2>/dev/null && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ' | sed 's/ $//'); }

# ---- into a prefix ----
prefix=$tmp/prefix
if make install PREFIX="$prefix" >"$tmp/log" 2>&1; then
  got=$(files "$prefix")
  if [ "$got" = "$want_files" ]; then pass prefix_installs_headers_ddprun_pc_cmake
  else failed prefix_installs_headers_ddprun_pc_cmake "installed '$got', want '$want_files'"; fi
else
  failed prefix_installs_headers_ddprun_pc_cmake "make install failed: $(log)"
fi

if ! command -v cmake >/dev/null; then
  echo "SKIP install.cmake_consumer: cmake not found (Debian package cmake)"
elif cmake -S "$tmp/src" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/log" 2>&1 &&
     cmake --build "$tmp/cmake" >>"$tmp/log" 2>&1; then
  out=$("$tmp/cmake/consumer" --nproc 3 2>"$tmp/err")
  if [ "$out" = "sum 6 over 3 ranks" ]; then pass cmake_consumer; else failed cmake_consumer "built, but printed '$out' $(err)"; fi
  out=$("$prefix/bin/ddprun" -n 2 "$tmp/cmake/consumer" 2>"$tmp/err")
  if [ "$out" = "sum 3 over 2 ranks" ]; then pass installed_ddprun_runs_it; else failed installed_ddprun_runs_it "printed '$out' $(err)"; fi
else
  failed cmake_consumer "find_package(ddp CONFIG) build failed: $(log)"
fi

if ! command -v pkg-config >/dev/null; then
  echo "SKIP install.pkg_config_consumer: pkg-config not found (Debian package pkg-config)"
else
  export PKG_CONFIG_PATH=$prefix/share/pkgconfig
  flags=$(pkg-config --cflags --libs ddp 2>"$tmp/log")
  if [ -n "$flags" ] && cc -O2 "$tmp/src/consumer.c" -o "$tmp/pc" $flags >>"$tmp/log" 2>&1; then
    out=$("$tmp/pc" --nproc 3 2>"$tmp/err")
    if [ "$out" = "sum 6 over 3 ranks" ] && [ -n "$version" ] && [ "$(pkg-config --modversion ddp)" = "$version" ]; then pass pkg_config_consumer
    else failed pkg_config_consumer "flags '$flags' built it, but it printed '$out' (version $(pkg-config --modversion ddp)) $(err)"; fi
  else
    failed pkg_config_consumer "pkg-config --cflags --libs ddp gave '$flags', build: $(log)"
  fi
  unset PKG_CONFIG_PATH
fi

if make uninstall PREFIX="$prefix" >"$tmp/log" 2>&1; then
  got=$(files "$prefix")
  if [ -z "$got" ] && [ ! -e "$prefix/share/cmake/ddp" ]; then pass prefix_uninstall_leaves_nothing
  else failed prefix_uninstall_leaves_nothing "left: '$got' $(ls -d "$prefix/share/cmake/ddp" 2>/dev/null)"; fi
else
  failed prefix_uninstall_leaves_nothing "make uninstall failed: $(log)"
fi

# ---- into a DESTDIR, as a package build does: paths inside name the real prefix ----
stage=$tmp/stage
if make install DESTDIR="$stage" PREFIX=/opt/ddp >"$tmp/log" 2>&1 && [ "$(files "$stage/opt/ddp")" = "$want_files" ] &&
   grep -qx 'prefix=/opt/ddp' "$stage/opt/ddp/share/pkgconfig/ddp.pc" && make uninstall DESTDIR="$stage" PREFIX=/opt/ddp >>"$tmp/log" 2>&1; then
  got=$(files "$stage")
  if [ -z "$got" ]; then pass destdir_install_and_uninstall; else failed destdir_install_and_uninstall "uninstall left '$got'"; fi
else
  failed destdir_install_and_uninstall "staged files '$(files "$stage")': $(log)"
fi
exit $fail
