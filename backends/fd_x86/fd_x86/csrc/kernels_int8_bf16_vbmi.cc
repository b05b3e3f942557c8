// kernels_int8_bf16.cc compiled for CPUs with AVX-512 VBMI as well: its
// int8 -> bf16 conversion by byte tables (vpermi2b) instead of widening to
// fp32 (that file's CodeTables note). Entry points wint8_pairs_bf16_vbmi and
// wint8_contract_bf16_vbmi, called by that file's plain build once
// __builtin_cpu_supports("avx512vbmi") said yes. The same bits.
#define FDX86_INT8_BF16_LUT 1
#include "kernels_int8_bf16.cc"
