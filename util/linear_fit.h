// LinearFit: y = intercept + slope * x, fitted by exponentially weighted least squares,
// so that it follows a quantity that drifts (a tier's read time over the bytes read, a
// prefill step's time over its tokens).
//
// Each Add(x, y, w) (or AddBounded, which first bounds an outlier) multiplies the weight of
// everything seen before by 1 - w and adds the new point with weight w.  Seed(intercept, slope, x)
// starts the fit from a line (two points of weight 1/2: (0, intercept) and (x, intercept + slope *
// x)) that the measurements then wear away.  The fit keeps slope > 0 and intercept >= 0: a read or
// a step never takes negative time, nor less time for more bytes.
//
// Thread-safety: none (the owner locks).
#ifndef KVENGINE_UTIL_LINEAR_FIT_H_
#define KVENGINE_UTIL_LINEAR_FIT_H_

#include <algorithm>

namespace kvengine {

class LinearFit {
 public:
  void Seed(double intercept, double slope, double x) {
    sw_ = 1;
    sx_ = x / 2;
    sy_ = intercept + slope * x / 2;
    sxx_ = x * x / 2;
    sxy_ = x * (intercept + slope * x) / 2;
    intercept_ = intercept;
    slope_ = slope;
  }

  void Add(double x, double y, double w) {
    const double keep = 1 - w;
    sw_ = sw_ * keep + w;
    sx_ = sx_ * keep + w * x;
    sy_ = sy_ * keep + w * y;
    sxx_ = sxx_ * keep + w * x * x;
    sxy_ = sxy_ * keep + w * x * y;
    Solve();
  }

  // Add, with y first brought within [Predict(x) / factor, Predict(x) * factor]: one
  // outlier (a load that waited for a core, a disk's hiccup) moves the fit by a bounded
  // step, while a lasting change still reaches it, a bounded step per point.
  void AddBounded(double x, double y, double w, double factor) {
    const double predicted = Predict(x);
    if (predicted > 0) y = std::clamp(y, predicted / factor, predicted * factor);
    Add(x, y, w);
  }

  double intercept() const { return intercept_; }
  double slope() const { return slope_; }
  double Predict(double x) const { return intercept_ + slope_ * x; }

 private:
  // The smallest slope kept: 1e-14 s per unit (100 TB/s, 1e14 tokens/s).
  static constexpr double kMinSlope = 1e-14;

  void Solve() {
    const double mx = sx_ / sw_, my = sy_ / sw_;
    const double vx = sxx_ / sw_ - mx * mx;
    const double cxy = sxy_ / sw_ - mx * my;
    if (vx > 1e-9 * mx * mx && cxy > 0) {
      slope_ = cxy / vx;
      intercept_ = my - slope_ * mx;
    } else {
      // Every point at one x (or a slope that is not positive): the intercept stays,
      // the slope takes the rest of the mean.
      slope_ = mx > 0 ? (my - intercept_) / mx : slope_;
    }
    if (intercept_ < 0) {  // through the origin instead
      intercept_ = 0;
      slope_ = sxx_ > 0 ? sxy_ / sxx_ : slope_;
    }
    if (slope_ < kMinSlope) {
      slope_ = kMinSlope;
      intercept_ = std::max(0.0, my - slope_ * mx);
    }
  }

  double sw_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  double intercept_ = 0, slope_ = kMinSlope;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_LINEAR_FIT_H_
