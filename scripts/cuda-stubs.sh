#!/usr/bin/env bash
# Writes link-time stand-ins for the CUDA driver and libraries, so a CUDA build links on a
# machine without a GPU driver. Each stub exports the symbols the compiled cudarc crate
# references and carries the real library's SONAME, so on the GPU machine the dynamic loader
# binds the real library.
#
#   scripts/cuda-stubs.sh DEPS_DIR STUB_DIR CUDART_SO
set -euo pipefail
deps="$1" out="$2" cudart="$3"
mkdir -p "$out"

symbols=$(for rlib in "$deps"/libcudarc-*.rlib; do nm "$rlib" 2>/dev/null; done |
  awk '$1 == "U" && ($2 ~ /^cu/ || $2 ~ /^nvrtc/ || $2 ~ /^nccl/) { print $2 }' | sort -u)
[ -n "$symbols" ] || { echo "error: no CUDA symbols in $deps/libcudarc-*.rlib; build the library first" >&2; exit 2; }

# library  symbol-prefix  soname (longest prefix first: cublasLt before cublas before cu)
while read -r lib prefix soname; do
  src="$out/$lib.c"
  : > "$src"
  for s in $symbols; do
    case "$s" in
      cublasLt*) owner=cublasLt ;;
      cublas*) owner=cublas ;;
      curand*) owner=curand ;;
      nvrtc*) owner=nvrtc ;;
      nccl*) owner=nccl ;;
      *) owner=cuda ;;
    esac
    [ "$owner" = "$lib" ] && echo "void $s(void) {}" >> "$src"
  done
  gcc -shared -fPIC -o "$out/lib$lib.so" -Wl,-soname,"$soname" "$src"
  echo "stub lib$lib.so ($soname): $(grep -c . "$src") symbols" >&2
done <<'LIBS'
cuda cu libcuda.so.1
cublas cublas libcublas.so.13
cublasLt cublasLt libcublasLt.so.13
curand curand libcurand.so.10
nvrtc nvrtc libnvrtc.so.13
nccl nccl libnccl.so.2
LIBS
ln -sf "$cudart" "$out/libcudart.so"
