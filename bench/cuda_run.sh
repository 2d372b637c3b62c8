#!/bin/sh
# The GPU machine's half of issue 34's checks, in as few device calls as possible (device time is scarce):
# Hearth's CUDA kernels' tests, then decode and prefill speed with them and without them (ONNX Runtime's own
# kernels: HEARTH_CUDA_KERNELS=0) on the same card in the same lease, and llama.cpp's llama-bench on the same GGUFs
# where a CUDA build of it was carried over. Results and logs go to $OUT.
#
#   sh bench/cuda_run.sh tests            # tests/test_cuda_kernels.py, tests/test_gpu.py
#   sh bench/cuda_run.sh layers           # one [4096 x 4096] layer in each form, Hearth's MatMulQ per block type
#   sh bench/cuda_run.sh speed MODEL...   # MODEL: default | gemma | llama3-8b-q4km | qwen2.5-7b-q4km
#                                         # (KERNELS=1: Hearth's kernels only; SUFFIX=-x: names the results apart)
#   sh bench/cuda_run.sh peer MODEL...    # llama-bench (flash attention on) on the same GGUFs
#   sh bench/cuda_run.sh profile MODEL... # every kernel of a decode step at ~1k tokens, timed by ncu (after `speed`)
#   sh bench/cuda_run.sh window           # the real Gemma in the desktop window on CUDA (needs PySide6: /root/qt)
#
# The decode attention: HEARTH_CUDA_ATTENTION=0 (with SUFFIX=-ortattn) times ONNX Runtime's beside Hearth's;
# HEARTH_CUDA_ATTENTION_FOLD=0 (SUFFIX=-nofold) the QK norms and QKV bias left to the graph (folded in by default);
# HEARTH_CUDA_ATTENTION_BLOCKS_PER_SM=n (SUFFIX=-abpsmN) n blocks a multiprocessor for the splits, not 2.
# HEARTH_CUDA_PDL=0 (SUFFIX=-nopdl): every kernel launched plainly, none starting before the one ahead of it ends.
#
# llama-bench: llama.cpp as vendored by llama-cpp-python 0.3.36, built on a machine with nvcc 13.0 (no GPU needed):
#   cmake -B build-cuda -DGGML_CUDA=ON -DGGML_CUDA_NO_VMM=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
#     -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_CUDA_FA_ALL_QUANTS=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-cuda --target llama-bench      # then strip, xz, carry as .gpu/peer/llama-bench.xz
#
# Expects onnxruntime-gpu and the pure-Python wheels in /root/site, the real GGUFs under .test-cache/home/models
# (the test cache's layout) and, for `peer`, llama-bench at /root/peer/llama-bench.
set -u
export PYTHONPATH="/root/site:$PWD" PYTHONUNBUFFERED=1 HEARTH_CUDA_KERNELS=1  # asked for: off by default until verified
out=${OUT:-/tmp/hearth-out}
data=/root/hearth-data  # converted models and synthetic GGUFs stay here while the machine is warm
mkdir -p "$out" "$data/models"
models=.test-cache/home/models
phase=$1
shift

gguf_of() {
    case $1 in
    default) echo "$models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    gemma) echo "$models/gemma-3-270m-q4_k_m.gguf" ;;
    *) echo "$data/models/synthetic-$1-32768.gguf" ;;  # written by bench/gpu.py --synthetic on first use
    esac
}

case $phase in
tests)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
    timeout 560 python3 -m pytest tests/test_cuda_kernels.py tests/test_cuda_attention.py tests/test_gpu.py -q -p no:cacheprovider -rs \
        > "$out/tests.txt" 2>&1
    tail -5 "$out/tests.txt"
    ;;
layers)
    timeout 300 python3 bench/cuda_layer_forms.py --layers 16 --json "$out/layer_forms.json" > "$out/layer_forms.md" 2>&1
    cat "$out/layer_forms.md"
    ;;
speed)
    for model in "$@"; do
        for kernels in ${KERNELS:-1 0}; do  # KERNELS=1: Hearth's kernels only
            case $model in
            default | gemma) source="--model $(gguf_of "$model")" ;;
            *) source="--synthetic $model" ;;
            esac
            # shellcheck disable=SC2086
            HEARTH_CUDA_KERNELS=$kernels timeout 300 python3 bench/gpu.py --data-dir "$data" $source \
                --contexts 1024,8000 --resume-sizes '' --loop --out "$out/gpu-$model-kernels$kernels${SUFFIX:-}.json" \
                > "$out/gpu-$model-kernels$kernels${SUFFIX:-}.txt" 2>&1
            tail -12 "$out/gpu-$model-kernels$kernels${SUFFIX:-}.txt"
        done
    done
    ;;
profile)
    for model in "$@"; do
        timeout 300 python3 bench/gpu_kernels.py --data-dir "$data" --model "$(gguf_of "$model")" --context 1024 \
            --tool ncu --out "$out/kernels-$model${SUFFIX:-}.json" > "$out/kernels-$model${SUFFIX:-}.txt" 2>&1
        head -30 "$out/kernels-$model${SUFFIX:-}.txt"
    done
    ;;
window)
    # PySide6's Core/Gui/Widgets/Network/Test with the offscreen platform and the system libraries they link,
    # packed here by bench/gpu_qt_bundle.sh (the GPU machine has no Qt and no package index)
    if [ ! -d /root/qt/site ] && [ -f .gpu/qt.tar.xz ]; then
        mkdir -p /root/qt && python3 -c "import lzma, tarfile; tarfile.open(fileobj=lzma.open('.gpu/qt.tar.xz')).extractall('/root/qt')"
        python3 -m pip install -q --root-user-action ignore --no-index --no-deps --target /root/qt/site /root/qt/pytest_qt-*.whl
    fi
    PYTHONPATH="/root/qt/site:$PYTHONPATH" LD_LIBRARY_PATH=/root/qt/sys QT_QPA_PLATFORM=offscreen timeout 300 \
        python3 -m pytest tests/test_gpu.py -k window -q -p no:cacheprovider -rs > "$out/window.txt" 2>&1
    tail -15 "$out/window.txt"
    ;;
peer)
    if [ ! -x /root/peer/llama-bench ] && [ -f .gpu/peer/llama-bench.xz ]; then  # carried compressed (41 MB)
        mkdir -p /root/peer
        python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/peer/llama-bench.xz'), open('/root/peer/llama-bench', 'wb'))"
        chmod +x /root/peer/llama-bench
    fi
    for model in "$@"; do
        timeout 300 /root/peer/llama-bench -m "$(gguf_of "$model")" -fa 1 -ngl 99 -p 512 -n 128 -d 1024,8000 -r 3 \
            -o md > "$out/llama-bench-$model.md" 2>&1
        cat "$out/llama-bench-$model.md"
    done
    ;;
esac
