#!/bin/sh
# Cross-build llama.cpp for an ARM CPU path and tools/llamacpp_logits.c against it, static, to run under Debian's
# qemu-user (apt-get install qemu-user g++-aarch64-linux-gnu): the references of numerics ggml's NEON paths.
#   sh tools/build_llamacpp_arm.sh SDIST_LLAMA_CPP neon-dotprod OUT_DIR   # 145 s on 2 cores (2026-11-27)
#   qemu-aarch64 OUT_DIR/llamacpp_logits MODEL.gguf 256 1,2,3 logits.f32
# neon-dotprod is Apple M1's (armv8.2-a, dotprod, fp16 vector arithmetic); neon-i8mm adds i8mm (Apple M2 and up).
set -eu
src=$1 path=$2 out=$3
case $path in
    neon-dotprod) march=armv8.2-a+dotprod+fp16 cpu=max,sve=off,sme=off,pauth=off ;;
    neon-i8mm) march=armv8.6-a+dotprod+fp16+i8mm cpu=max,sve=off,sme=off,pauth=off ;;
    *) echo "unknown ARM path $path (neon-dotprod, neon-i8mm)" >&2; exit 2 ;;
esac
cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="$march" -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF > "$out/cmake.log"
cmake --build "$out/build" --target llama -j2 > "$out/build.log"
aarch64-linux-gnu-g++ -O2 -static -o "$out/llamacpp_logits" -x c "$(dirname "$0")/llamacpp_logits.c" -x none \
    -I"$src/include" -I"$src/ggml/include" "$out/build/src/libllama.a" "$out/build/ggml/src/libggml.a" \
    "$out/build/ggml/src/libggml-cpu.a" "$out/build/ggml/src/libggml-base.a" -lpthread -lm
echo "$cpu" > "$out/qemu-cpu"  # qemu-aarch64 -cpu $(cat OUT_DIR/qemu-cpu): a CPU with the path's features
