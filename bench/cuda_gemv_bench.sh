#!/bin/sh
# bench/cuda_gemv_bench.cu on the GPU machine: build it, time every form (PDL on, then off), and with NCU=1 profile
# the library's gate|up and Q6_K down launches (ncu's memory and stall sections). Results go to $OUT.
#   sh bench/cuda_gemv_bench.sh [REPS]
set -eu
out=${OUT:-/tmp/hearth-out}
mkdir -p "$out"
nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo bench/cuda_gemv_bench.cu -o /tmp/gemv_bench
reps=${1:-200}
/tmp/gemv_bench "$reps" | tee "$out/gemv-bench.txt"
if [ "${NCU:-0}" = 1 ]; then
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    # the library form's launches: 1 check + 5 warm-up + 30 timed a shape; shape 3 is 8b.gate_up, 4 is 8b.down6
    for skip in 120 156; do
        timeout 120 "$ncu" --kernel-name regex:gemv_q8x --launch-skip $skip --launch-count 1 --section SpeedOfLight \
            --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section SchedulerStats /tmp/gemv_bench 30 > "$out/ncu-$skip.txt" 2>&1 || true
        grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers|Stall|Warp Cycles|Issued|Eligible|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$out/ncu-$skip.txt" | head -40
    done
    cuobjdump -sass -fun '_Z15gemv_q8x_kernelILi1ELi2EEvPKhiiil10HqSegmentsP6__half' /tmp/gemv_bench > "$out/sass-q8x-1-2.txt" 2>&1 || true
fi
