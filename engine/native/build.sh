#!/bin/sh
# Builds libhearth_kernels for this platform from hearth_*.c (see hearth_ort.h for what is in it).
# The result is committed (engine/native/linux-x86_64/), so installing Hearth needs no compiler; the
# source hash baked into it lets the engine and a test check that the binary matches these sources.
#
#   sh engine/native/build.sh [output.so]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/linux-x86_64/libhearth_kernels.so}
# The same files, in the same order, as engine/runtime/native_library.py's SOURCES.
sources="hearth_attention.c hearth_gather.c hearth_head.c hearth_matmul.c hearth_matmul.h hearth_matmul_impl.h
hearth_matmul_avx2.c hearth_matmul_avx512.c hearth_matmul_avx512vnni.c hearth_matmul_portable.c hearth_ort.c
hearth_ort.h hearth_unpack.h ort_abi.h"
hash=$(cd "$here" && cat $sources | sha256sum | cut -c1-16)
mkdir -p "$(dirname "$out")"
objects=$(mktemp -d)
trap 'rm -rf "$objects"' EXIT
# Baseline x86-64 code; the hot loops carry their own AVX2/FMA target attributes, and the library
# refuses to register on a CPU without them. -fno-math-errno lets expf inline; nothing else is relaxed.
common="-std=c11 -O3 -fPIC -fvisibility=hidden -fno-math-errno -Wall -Wextra -Werror"
cc=${CC:-cc}
for f in hearth_attention hearth_gather hearth_head hearth_matmul hearth_ort; do
    $cc $common -DHEARTH_SOURCE_HASH="\"$hash\"" -c "$here/$f.c" -o "$objects/$f.o"
done
# MatMulQ's arithmetic once per instruction set (hearth_matmul.c picks one at run time by the CPU's
# features). Contraction into FMAs is allowed there: every decoded weight s·q is exact, so it changes
# only the summation's rounding (hearth_unpack.h). The vector helpers are static and inlined, so the
# psabi note (a vector argument's ABI under these flags) concerns no call that crosses a file.
isa_portable=""
isa_avx2="-mavx2 -mfma -mf16c"
isa_avx512="$isa_avx2 -mavx512f -mavx512bw -mavx512vl"
isa_avx512vnni="$isa_avx512 -mavx512vnni"
for isa in portable avx2 avx512 avx512vnni; do
    eval flags=\$isa_$isa
    # shellcheck disable=SC2086
    $cc $common -Wno-psabi -ffp-contract=fast $flags -c "$here/hearth_matmul_$isa.c" -o "$objects/matmul_$isa.o"
done
$cc -shared -o "$out.tmp" "$objects"/*.o -lm
mv "$out.tmp" "$out"
echo "built $out (source $hash)"
