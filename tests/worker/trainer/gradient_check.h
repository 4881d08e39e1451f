// Finite-difference checks of backward passes, shared by the layer and model tests.
#ifndef ADAPS_TESTS_WORKER_TRAINER_GRADIENT_CHECK_H_
#define ADAPS_TESTS_WORKER_TRAINER_GRADIENT_CHECK_H_

#include <cmath>
#include <functional>
#include <random>

#include "gtest/gtest.h"

namespace adaps::trainer::testing {

// True when an analytic derivative agrees with a central difference.
inline ::testing::AssertionResult Close(double analytic, double numeric, double abs_tol = 2e-3,
                                        double rel_tol = 2e-2) {
  if (std::abs(analytic - numeric) <= abs_tol + rel_tol * std::abs(numeric)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "analytic " << analytic << " vs numeric " << numeric;
}

// Central difference of `loss` with respect to `*x`.
inline double Numeric(float* x, float eps, const std::function<double()>& loss) {
  const float saved = *x;
  *x = saved + eps;
  const double plus = loss();
  *x = saved - eps;
  const double minus = loss();
  *x = saved;
  return (plus - minus) / (2.0 * eps);
}

}  // namespace adaps::trainer::testing

#endif  // ADAPS_TESTS_WORKER_TRAINER_GRADIENT_CHECK_H_
