#include "tools/stress/key_space.h"

#include <cmath>
#include <cstdio>

namespace kvengine::stress {

uint32_t KeySpace::WorkerOf(uint32_t key) const {
  // The largest w with Begin(w) <= key.
  uint32_t w = static_cast<uint32_t>((uint64_t{key} * workers_ + workers_ - 1) / keys_);
  while (w > 0 && Begin(w) > key) w--;
  while (w + 1 < workers_ && Begin(w + 1) <= key) w++;
  return w;
}

std::string KeySpace::Name(uint32_t key) const {
  const uint32_t w = WorkerOf(key);
  char name[40];
  std::snprintf(name, sizeof(name), "stress.w%03u.%07u", w, key - Begin(w));
  return name;
}

std::string KeySpace::TenKeyPattern(uint32_t worker, uint32_t first,
                                    std::vector<uint32_t>* keys) const {
  char pattern[48];
  std::snprintf(pattern, sizeof(pattern), "stress\\.w%03u\\.%06u[0-9]", worker, first / 10);
  keys->clear();
  for (uint32_t i = first - first % 10; i < first - first % 10 + 10; i++) {
    if (Begin(worker) + i < End(worker)) keys->push_back(Begin(worker) + i);
  }
  return pattern;
}

KeyChooser::KeyChooser(uint32_t n, bool zipf) : n_(n == 0 ? 1 : n), zipf_(zipf) {
  if (!zipf_) return;
  double zeta2 = 0;
  for (uint32_t i = 1; i <= n_; i++) {
    const double term = 1.0 / std::pow(static_cast<double>(i), theta_);
    zetan_ += term;
    if (i <= 2) zeta2 += term;
  }
  alpha_ = 1.0 / (1.0 - theta_);
  eta_ = (1.0 - std::pow(2.0 / n_, 1.0 - theta_)) / (1.0 - zeta2 / zetan_);
  half_pow_theta_ = 1.0 + std::pow(0.5, theta_);
}

uint32_t KeyChooser::Next(std::mt19937_64& rng) {
  if (!zipf_ || n_ < 3) return static_cast<uint32_t>(rng() % n_);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  const double uz = u * zetan_;
  if (uz < 1.0) return 0;
  if (uz < half_pow_theta_) return 1;
  const auto r = static_cast<uint32_t>(n_ * std::pow(eta_ * u - eta_ + 1.0, alpha_));
  return r < n_ ? r : n_ - 1;
}

}  // namespace kvengine::stress
