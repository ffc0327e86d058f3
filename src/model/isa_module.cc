// The one symbol an ISA module exports: isa.cc loads the module and looks it
// up by name (kModuleEntry); the module's version script, isa_module.map,
// keeps every other symbol to the module.
#include "model/models.h"

namespace hetps::model_internal {
namespace {

// The flags a module is built with must give it the level it claims.
#if defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__)
constexpr bool kBuiltForAvx2 = true;
#else
constexpr bool kBuiltForAvx2 = false;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512CD__)
constexpr bool kBuiltForAvx512 = true;
#else
constexpr bool kBuiltForAvx512 = false;
#endif
static_assert(kCompiledIsa != Isa::kSse2, "modules are for levels above sse2");
static_assert(kCompiledIsa != Isa::kAvx2 || kBuiltForAvx2,
              "the avx2 module needs -mavx2 -mfma -mbmi -mbmi2 -mf16c");
static_assert(kCompiledIsa != Isa::kAvx512 || kBuiltForAvx512,
              "the avx512 module needs the avx2 flags and -mavx512{f,bw,cd,dq,vl}");

}  // namespace
}  // namespace hetps::model_internal

extern "C" __attribute__((visibility("default")))
const hetps::model_internal::ModelFactories* hetps_model_factories() {
  return &hetps::model_internal::kCompiledModels;
}
