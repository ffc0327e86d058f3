// Which copy of the built-in models runs (model.h, Isa).
//
// The avx2 and avx512 copies are shared modules that the build embeds in the
// binary (the .incbin below; CMakeLists.txt builds them from the models'
// sources with that level's flags). Loading one copies it into an anonymous
// memory file (memfd_create) and dlopens it from /proc/self/fd with
// RTLD_LOCAL, so the binary stays one file. Each module was linked with a
// version script that exports only its entry point: its Eigen and standard
// library instantiations, compiled for its level, bind inside it and can
// never replace the baseline's, which must run on every x86-64 CPU. (Linking
// the copies into one binary instead would let the linker keep one of each
// identical template instantiation for all of them.)
//
// A loaded module is never unloaded: models created from it may live until
// the process exits.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "model/model.h"
#include "model/models.h"

#if defined(HETPS_MODEL_AVX2_SO) && defined(HETPS_MODEL_AVX512_SO)
#define HETPS_MODEL_ISA_MODULES 1
// Hidden globals: visible to this file's C++ below, not outside the binary.
#define HETPS_EMBED(name, path)                              \
  ".globl " name "\n.hidden " name "\n" name ":\n"           \
  ".incbin \"" path "\"\n"                                   \
  ".globl " name "_end\n.hidden " name "_end\n" name "_end:\n"
asm(".pushsection .rodata.hetps_model_isa,\"a\"\n"
    ".balign 64\n" HETPS_EMBED("hetps_model_avx2_image", HETPS_MODEL_AVX2_SO)
    ".balign 64\n" HETPS_EMBED("hetps_model_avx512_image",
                                HETPS_MODEL_AVX512_SO)
    ".popsection\n");
#undef HETPS_EMBED
extern "C" const unsigned char hetps_model_avx2_image[];
extern "C" const unsigned char hetps_model_avx2_image_end[];
extern "C" const unsigned char hetps_model_avx512_image[];
extern "C" const unsigned char hetps_model_avx512_image_end[];
#else
#define HETPS_MODEL_ISA_MODULES 0
#endif

namespace hetps {
namespace {

using model_internal::ModelFactories;

constexpr std::array<Isa, 3> kIsas = {Isa::kSse2, Isa::kAvx2, Isa::kAvx512};

// Why this CPU cannot run `isa`, or "" when it can. The checks are the
// module's compile flags (CMakeLists.txt), feature by feature; libgcc's
// answers also require the OS to save the wider registers.
std::string CpuLacks(Isa isa) {
  if (isa == Isa::kSse2) return "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  std::vector<const char*> missing;
  const auto need = [&missing](bool has, const char* feature) {
    if (!has) missing.push_back(feature);
  };
  need(__builtin_cpu_supports("avx2") != 0, "AVX2");
  need(__builtin_cpu_supports("fma") != 0, "FMA");
  need(__builtin_cpu_supports("bmi") != 0, "BMI1");
  need(__builtin_cpu_supports("bmi2") != 0, "BMI2");
  if (isa == Isa::kAvx512) {
    need(__builtin_cpu_supports("avx512f") != 0, "AVX-512F");
    need(__builtin_cpu_supports("avx512bw") != 0, "AVX-512BW");
    need(__builtin_cpu_supports("avx512cd") != 0, "AVX-512CD");
    need(__builtin_cpu_supports("avx512dq") != 0, "AVX-512DQ");
    need(__builtin_cpu_supports("avx512vl") != 0, "AVX-512VL");
  }
  if (missing.empty()) return "";
  return absl::StrCat("this CPU lacks ", absl::StrJoin(missing, ", "));
#else
  return "this build has no x86-64 modules";
#endif
}

#if HETPS_MODEL_ISA_MODULES
std::span<const unsigned char> ModuleImage(Isa isa) {
  if (isa == Isa::kAvx2) {
    return {hetps_model_avx2_image, hetps_model_avx2_image_end};
  }
  return {hetps_model_avx512_image, hetps_model_avx512_image_end};
}

// Loads `isa`'s module. Its memory file is left open in `files`: dlopen
// knows a loaded object by its path first, so a second module must not get
// the same /proc/self/fd/N (the caller closes them all once every module is
// loaded; the mappings keep the memory).
absl::StatusOr<const ModelFactories*> LoadModule(Isa isa,
                                                 std::vector<int>& files) {
  const std::string name = absl::StrCat("hetps_model_", IsaName(isa));
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  files.push_back(fd);
  std::span<const unsigned char> left = ModuleImage(isa);
  while (!left.empty()) {
    const ssize_t n = write(fd, left.data(), left.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("writing the module: ", std::strerror(errno)));
    }
    left = left.subspan(static_cast<size_t>(n));
  }
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::UnavailableError(absl::StrCat("dlopen: ", dlerror()));
  }
  void* entry = dlsym(handle, model_internal::kModuleEntry);
  if (entry == nullptr) {
    return absl::InternalError(absl::StrCat(
        "the module has no ", model_internal::kModuleEntry, ": ", dlerror()));
  }
  const ModelFactories* factories =
      reinterpret_cast<const ModelFactories* (*)()>(entry)();
  if (factories->isa != isa) {
    return absl::InternalError(
        absl::StrCat("the module holds level ", IsaName(factories->isa)));
  }
  return factories;
}
#endif

// Every level's factories, or why there are none; filled once, at first use.
struct Levels {
  std::array<const ModelFactories*, kIsas.size()> factories{};
  std::array<std::string, kIsas.size()> why_not;
};

Levels LoadLevels() {
  Levels levels;
  levels.factories[0] = &model_internal::kCompiledModels;
  std::vector<int> files;
  for (size_t i = 1; i < kIsas.size(); ++i) {
    const Isa isa = kIsas[i];
    levels.why_not[i] = CpuLacks(isa);
    if (!levels.why_not[i].empty()) continue;
#if HETPS_MODEL_ISA_MODULES
    auto module = LoadModule(isa, files);
    if (module.ok()) {
      levels.factories[i] = *module;
      continue;
    }
    levels.why_not[i] = absl::StrCat("its module did not load (",
                                     module.status().message(), ")");
    spdlog::warn("models: {}: {}; running below it", IsaName(isa),
                 levels.why_not[i]);
#else
    levels.why_not[i] = "this build carries no module for it";
#endif
  }
  for (int fd : files) close(fd);
  return levels;
}

const Levels& LoadedLevels() {
  static const Levels levels = LoadLevels();
  return levels;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kSse2:
      return "sse2";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::vector<Isa> AvailableIsas() {
  std::vector<Isa> available;
  const Levels& levels = LoadedLevels();
  for (size_t i = 0; i < kIsas.size(); ++i) {
    if (levels.factories[i] != nullptr) available.push_back(kIsas[i]);
  }
  return available;
}

absl::StatusOr<Isa> SelectIsa(const std::string& train_isa) {
  const std::vector<Isa> available = AvailableIsas();
  if (train_isa == "auto") return available.back();
  for (size_t i = 0; i < kIsas.size(); ++i) {
    if (train_isa != IsaName(kIsas[i])) continue;
    const Levels& levels = LoadedLevels();
    if (levels.factories[i] != nullptr) return kIsas[i];
    std::vector<std::string> names;
    for (Isa isa : available) names.push_back(IsaName(isa));
    return absl::FailedPreconditionError(absl::StrCat(
        "train.isa: ", train_isa, " cannot run here: ", levels.why_not[i],
        " (available: ", absl::StrJoin(names, ", "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("train.isa: unknown instruction-set level '", train_isa,
                   "' (expected auto, sse2, avx2, avx512)"));
}

namespace model_internal {

const ModelFactories& FactoriesFor(Isa isa) {
  const ModelFactories* factories =
      LoadedLevels().factories[static_cast<size_t>(isa)];
  return factories != nullptr ? *factories : kCompiledModels;
}

}  // namespace model_internal
}  // namespace hetps
