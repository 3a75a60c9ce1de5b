// Damage: what a crash and a bad disk do to a file, chosen by the fuzzer, for the targets
// that write a file with the format's own writer and then check what the reader makes of
// it once damaged.
#ifndef KVENGINE_TEST_FUZZ_DAMAGE_H_
#define KVENGINE_TEST_FUZZ_DAMAGE_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <string>

namespace kvengine::fuzz {

// Perhaps cuts `file` short (a torn write), then perhaps flips bits of one byte.
inline void TearAndFlip(FuzzedDataProvider& in, std::string* file) {
  if (in.ConsumeBool()) file->resize(in.ConsumeIntegralInRange<size_t>(0, file->size()));
  if (!file->empty() && in.ConsumeBool()) {
    (*file)[in.ConsumeIntegralInRange<size_t>(0, file->size() - 1)] ^=
        static_cast<char>(in.ConsumeIntegralInRange<int>(1, 255));
  }
}

}  // namespace kvengine::fuzz

#endif  // KVENGINE_TEST_FUZZ_DAMAGE_H_
