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
sources="hearth_attention.c hearth_gather.c hearth_head.c hearth_ort.c hearth_ort.h hearth_unpack.h ort_abi.h"
hash=$(cd "$here" && cat $sources | sha256sum | cut -c1-16)
mkdir -p "$(dirname "$out")"
# Baseline x86-64 code; the hot loops carry their own AVX2/FMA target attributes, and the library
# refuses to register on a CPU without them. -fno-math-errno lets expf inline; nothing else is relaxed.
${CC:-cc} -std=c11 -O3 -fPIC -shared -fvisibility=hidden -fno-math-errno -Wall -Wextra -Werror \
    -DHEARTH_SOURCE_HASH="\"$hash\"" -o "$out.tmp" \
    "$here/hearth_attention.c" "$here/hearth_gather.c" "$here/hearth_head.c" "$here/hearth_ort.c" -lm
mv "$out.tmp" "$out"
echo "built $out (source $hash)"
