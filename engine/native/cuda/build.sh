#!/bin/sh
# Builds libhearth_cuda (Hearth's CUDA kernels as ONNX Runtime custom ops, hearth_cuda.cu) with nvcc, for the
# GPU generations the package claims: Ampere (sm_80, sm_86), Ada (sm_89), Hopper (sm_90), plus compute_90 PTX
# that newer GPUs compile at load. The CUDA runtime is linked statically, so the library needs only the driver.
# The result is committed (engine/native/linux-x86_64/), so installing Hearth needs no compiler; the source hash
# baked into it lets engine/runtime/cuda_kernels.py and a test check that the binary matches these sources.
#
#   sh engine/native/cuda/build.sh [output.so]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../linux-x86_64/libhearth_cuda.so}
# The same files, in the same order, as engine/runtime/cuda_kernels.py's SOURCES.
hash=$(cat "$here/hearth_cuda.cu" "$here/hearth_cuda_kernels.cuh" "$here/hearth_cuda_q8.cuh" "$here/hearth_cuda_blocks.cuh" "$here/hearth_cuda_attention.cuh" "$here/../ort_abi.h" \
       | sha256sum | cut -c1-16)
nvcc=${NVCC:-nvcc}
mkdir -p "$(dirname "$out")"
$nvcc -O3 -std=c++17 -shared -cudart static -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
    -Werror all-warnings \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 -gencode arch=compute_89,code=sm_89 \
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -DHEARTH_CUDA_SOURCE_HASH="\"$hash\"" "$here/hearth_cuda.cu" -o "$out.tmp" -ldl -lpthread -lrt
strip --strip-unneeded "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out (source $hash)"
