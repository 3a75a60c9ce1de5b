// KeySpace: kv_stress's keys, their names, and which worker writes each.
//
// Key k (0 <= k < keys) belongs to worker k * workers / keys's range: worker w writes
// only the keys of [Begin(w), End(w)), so a key never has two writers (the oracle's
// rule, expected_state.h), across threads and across the processes of an attach run.
// Any worker may read any key.  Names spell the worker and the index within its range,
// "stress.w003.0000127", so a pattern can name ten keys of one worker for
// DeleteByRegex ("stress\.w003\.000012[0-9]").
//
// KeyChooser draws keys uniformly or from a Zipfian distribution (YCSB's generator,
// theta 0.99: the first keys of a range are the hot ones).  Not thread-safe: one per
// worker thread.
#ifndef KVENGINE_TOOLS_STRESS_KEY_SPACE_H_
#define KVENGINE_TOOLS_STRESS_KEY_SPACE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kvengine::stress {

class KeySpace {
 public:
  KeySpace(uint32_t keys, uint32_t workers) : keys_(keys), workers_(workers) {}
  uint32_t keys() const { return keys_; }
  uint32_t workers() const { return workers_; }
  uint32_t Begin(uint32_t worker) const {
    return static_cast<uint32_t>(uint64_t{worker} * keys_ / workers_);
  }
  uint32_t End(uint32_t worker) const { return Begin(worker + 1); }
  uint32_t WorkerOf(uint32_t key) const;
  std::string Name(uint32_t key) const;
  // The pattern that names keys [first, first + 10) of `worker`'s range (first: a
  // multiple of ten, relative to Begin(worker)), and those keys (the ones that exist).
  std::string TenKeyPattern(uint32_t worker, uint32_t first, std::vector<uint32_t>* keys) const;

 private:
  uint32_t keys_;
  uint32_t workers_;
};

class KeyChooser {
 public:
  // n >= 1 keys to choose among; zipf: Zipfian (theta 0.99), else uniform.
  KeyChooser(uint32_t n, bool zipf);
  // An index in [0, n).
  uint32_t Next(std::mt19937_64& rng);

 private:
  uint32_t n_;
  bool zipf_;
  double theta_ = 0.99, alpha_ = 0, zetan_ = 0, eta_ = 0, half_pow_theta_ = 0;
};

}  // namespace kvengine::stress

#endif  // KVENGINE_TOOLS_STRESS_KEY_SPACE_H_
