// What this CPU can run, asked once per process. For the ops' translation
// units only (baseline x86-64 code): a kernel TU, compiled for its ISA, must
// not include it, so no copy of these inline functions is built for AVX-512.
#pragma once

namespace fdx86 {

inline bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

// AVX-512 F/BW/VL/DQ: the attention, KV-store and 16-bit linear kernels.
inline bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

// ... and VNNI: the packed int8 / int4 linear kernels.
inline bool cpu_has_avx512_vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

}  // namespace fdx86
