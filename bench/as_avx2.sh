#!/usr/bin/env bash
# Run a command on an AVX-512 machine as if its CPU had only AVX2 + FMA (most laptops, AMD Zen 2/3):
# oneDNN, PyTorch's own kernels and MKL are capped at AVX2, and decode_ops.c is built for x86-64-v3
# (AVX2, FMA, no AVX-512; a build of its own in the cache, keyed by the flags). bf16 autocast stays
# off (grpo.models.precision.native_bf16 reads the oneDNN cap): the default (bf16=null) trains in fp32, as on a
# real AVX2 machine.
#   bench/as_avx2.sh .venv/bin/python bench/decode_limit.py
#   bench/as_avx2.sh make test
set -euo pipefail
export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 GRPO_NATIVE_MARCH=x86-64-v3
exec "$@"
