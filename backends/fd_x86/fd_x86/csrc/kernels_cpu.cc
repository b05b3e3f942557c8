// CPU / OS checks that need more than __builtin_cpu_supports, compiled for
// baseline x86-64 (called before any ISA-specific kernel runs).
#include <cpuid.h>
#include <cstdlib>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels.h"

namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ARCH_REQ_XCOMP_PERM
constexpr long kXfeatureXtiledata = 18;

bool cpu_has_amx_int8() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
  // the AVX-512 half of the kernel (epilogue) too
  __builtin_cpu_init();
  return amx_tile && amx_int8 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

bool cpu_has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  __builtin_cpu_init();
  return amx_tile && amx_bf16 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}

bool os_grants_tile_data() {
#ifdef SYS_arch_prctl
  // Linux >= 5.16: the tile data state is off until the process asks (once,
  // for all its threads); older kernels / no AMX support answer an error
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace

namespace fdx86 {

bool amx_available() {
  static const bool ok = cpu_has_amx_int8() && os_grants_tile_data();  // thread-safe, once
  return ok;
}

bool amx_bf16_available() {
  static const bool ok = cpu_has_amx_bf16() && os_grants_tile_data();
  return ok;
}

bool amx_bf16_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("FD_X86_AMX");
    return !(env != nullptr && std::strcmp(env, "0") == 0) && amx_bf16_available();
  }();
  return on;
}

}  // namespace fdx86
