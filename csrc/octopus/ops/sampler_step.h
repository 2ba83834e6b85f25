// One diffusion sampler step for a whole batch, each sample at its own timestep.
//
// Every fused sampler (DDIM, Euler, flow-matching Euler, DPM-Solver++ 2M) is, per sample,
// a linear update with coefficients that depend only on that sample's timestep:
//   x0   = clip(a * x + b * m)                  (the predicted clean sample)
//   prev = p * x + q * x0 + r * m + s * z + u * h
// with x the sample, m the model output, z noise, h the sample's previous x0 (the
// multistep history, overwritten with this step's x0). item(i) looks up sample i's step
// in its schedule and computes the coefficients in double from the device tables; the
// elements then cost a few fused multiply-adds. A negative timestep leaves its sample as it
// is (prev = x, history untouched): samples that have finished, or not started yet, ride
// along in the batch. Run by the generic drivers.
#pragma once

#include <cmath>
#include <cstdint>

#include "octopus/core/plan.h"
#include "octopus/core/vec.h"

namespace octopus {

enum class SamplerKind : int64_t { DDIM = 0, Euler = 1, FlowEuler = 2, DPMSolverPP2M = 3 };
enum class Prediction : int64_t { Epsilon = 0, VPrediction = 1, Sample = 2, Flow = 3 };

// Per-row (one row shared by all samples, or one per sample) integer facts.
struct RowInfo {
  static constexpr int kLength = 0;       // steps in the row's schedule
  static constexpr int kStepRatio = 1;    // DDIM: num_train_timesteps // num_inference_steps
  static constexpr int kFinalFirstOrder = 2;  // DPM-Solver++: last step is first order
  static constexpr int kColumns = 3;
};

struct SamplerParams {
  SamplerKind kind;
  Prediction prediction;
  const double* __restrict__ timesteps;  // [N] each sample's current timestep
  const double* __restrict__ schedule;   // [R, S] each row's timesteps, descending
  const double* __restrict__ table;      // DDIM: alphas_cumprod [T]; others: sigmas [R, S + 1]
  const int64_t* __restrict__ row_info;  // [R, RowInfo::kColumns]
  int64_t rows, schedule_stride, table_size;
  double final_alpha_cumprod;  // DDIM
  double eta;                  // DDIM
  double clip_range;           // DDIM, 0: no clipping
  bool use_clipped_model_output;
};

struct StepCoefficients {
  double a, b, p, q, r, s, u, clip;
};

OCTOPUS_HD int64_t clamp_to(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// The index of the schedule entry nearest to t in a descending row of `length` entries.
OCTOPUS_HD int64_t schedule_index(const double* row, int64_t length, double t) {
  int64_t lo = 0, hi = length;  // first index with row[k] <= t
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (row[mid] > t) lo = mid + 1; else hi = mid;
  }
  if (lo >= length) return length - 1;
  if (lo > 0 && row[lo - 1] - t < t - row[lo]) return lo - 1;
  return lo;
}

OCTOPUS_HD StepCoefficients ddim_coefficients(const SamplerParams& P, int64_t row, double t) {
  const int64_t* info = P.row_info + row * RowInfo::kColumns;
  const int64_t ti = clamp_to(static_cast<int64_t>(llround(t)), 0, P.table_size - 1);
  const int64_t prev = ti - info[RowInfo::kStepRatio];
  const double at = P.table[ti];
  const double ap = prev >= 0 ? P.table[clamp_to(prev, 0, P.table_size - 1)] : P.final_alpha_cumprod;
  const double bt = 1.0 - at, sa = sqrt(at), sb = sqrt(bt);
  StepCoefficients k{};
  double c = 0.0, d = 1.0;  // eps = c * x + d * m
  switch (P.prediction) {
    case Prediction::Epsilon: k.a = 1.0 / sa; k.b = -sb / sa; c = 0.0; d = 1.0; break;
    case Prediction::Sample: k.a = 0.0; k.b = 1.0; c = 1.0 / sb; d = -sa / sb; break;
    default: k.a = sa; k.b = -sb; c = sb; d = sa; break;  // v-prediction
  }
  const double variance = (1.0 - ap) / (1.0 - at) * (1.0 - at / ap);
  const double std_dev = P.eta * sqrt(variance);
  const double dir = sqrt(1.0 - ap - std_dev * std_dev);
  k.clip = P.clip_range;
  k.q = sqrt(ap);
  if (P.use_clipped_model_output) {  // eps recomputed from the (clipped) x0
    k.p = dir / sb;
    k.q += -dir * sa / sb;
    k.r = 0.0;
  } else {
    k.p = dir * c;
    k.r = dir * d;
  }
  k.s = std_dev;
  return k;
}

OCTOPUS_HD void alpha_sigma(double sigma, double* alpha, double* sigma_t) {
  *alpha = 1.0 / sqrt(sigma * sigma + 1.0);
  *sigma_t = sigma * *alpha;
}

OCTOPUS_HD StepCoefficients sigma_coefficients(const SamplerParams& P, int64_t row, double t) {
  const int64_t* info = P.row_info + row * RowInfo::kColumns;
  const int64_t length = info[RowInfo::kLength];
  const double* sched = P.schedule + row * P.schedule_stride;
  const double* sigmas = P.table + row * (P.schedule_stride + 1);
  const int64_t k = schedule_index(sched, length, t);
  const double sigma = sigmas[k], next = sigmas[k + 1];
  StepCoefficients c{};
  if (P.kind == SamplerKind::FlowEuler) {  // prev = x + (sigma_next - sigma) * m
    c.a = 1.0; c.b = -sigma; c.p = 1.0; c.r = next - sigma;
    return c;
  }
  if (P.kind == SamplerKind::Euler) {
    switch (P.prediction) {
      case Prediction::Epsilon: c.a = 1.0; c.b = -sigma; break;
      case Prediction::Sample: c.a = 0.0; c.b = 1.0; break;
      default: c.a = 1.0 / (sigma * sigma + 1.0); c.b = -sigma / sqrt(sigma * sigma + 1.0); break;
    }
    const double dt = next - sigma;  // prev = x + (x - x0) / sigma * dt
    c.p = 1.0 + dt / sigma;
    c.q = -dt / sigma;
    return c;
  }
  // DPM-Solver++ (midpoint), second order where the history allows.
  double alpha_s0, sigma_s0, alpha_t, sigma_t;
  alpha_sigma(sigma, &alpha_s0, &sigma_s0);
  alpha_sigma(next, &alpha_t, &sigma_t);
  switch (P.prediction) {
    case Prediction::Epsilon: c.a = 1.0 / alpha_s0; c.b = -sigma_s0 / alpha_s0; break;
    case Prediction::Sample: c.a = 0.0; c.b = 1.0; break;
    default: c.a = alpha_s0; c.b = -sigma_s0; break;
  }
  const double lambda_t = log(alpha_t) - log(sigma_t);
  const double lambda_s0 = log(alpha_s0) - log(sigma_s0);
  const double h = lambda_t - lambda_s0;
  const double phi = alpha_t * (exp(-h) - 1.0);
  c.p = sigma_t / sigma_s0;
  c.q = -phi;
  const bool first_order = k == 0 || (k == length - 1 && info[RowInfo::kFinalFirstOrder] != 0);
  if (!first_order) {
    double alpha_s1, sigma_s1;
    alpha_sigma(sigmas[k - 1], &alpha_s1, &sigma_s1);
    const double r0 = (lambda_s0 - (log(alpha_s1) - log(sigma_s1))) / h;
    c.q = -phi * (1.0 + 0.5 / r0);  // D0 = x0, D1 = (x0 - h) / r0
    c.u = 0.5 * phi / r0;
  }
  return c;
}

template <typename scalar_t, typename acc_t>
struct SamplerStepOp {
  static constexpr int kVec = 16 / sizeof(scalar_t);
  static constexpr int kUnroll = 2;
  using V = Vec<scalar_t, kVec>;
  struct InVec {
    V m, x, z, h;
  };
  struct Item {
    acc_t a, b, p, q, r, s, u, clip;
    bool skip;  // negative timestep: prev = x, history untouched
  };

  const scalar_t* __restrict__ model_output;
  const scalar_t* __restrict__ sample;
  const scalar_t* __restrict__ noise;  // null: no noise term
  scalar_t* __restrict__ history;      // null: no history (read, then overwritten with x0)
  scalar_t* __restrict__ prev_sample;
  scalar_t* __restrict__ pred_x0;      // null: not wanted
  SamplerParams params;

  OCTOPUS_HD Item item(int64_t i) const {
    const int64_t row = params.rows == 1 ? 0 : i;
    const double t = params.timesteps[i];
    if (!(t >= 0.0)) return Item{acc_t(1), acc_t(0), acc_t(1), acc_t(0), acc_t(0), acc_t(0), acc_t(0), acc_t(0), true};
    const StepCoefficients c = params.kind == SamplerKind::DDIM ? ddim_coefficients(params, row, t)
                                                                 : sigma_coefficients(params, row, t);
    return Item{static_cast<acc_t>(c.a), static_cast<acc_t>(c.b), static_cast<acc_t>(c.p), static_cast<acc_t>(c.q),
                static_cast<acc_t>(c.r), static_cast<acc_t>(noise != nullptr ? c.s : 0.0),
                static_cast<acc_t>(history != nullptr ? c.u : 0.0), static_cast<acc_t>(c.clip), false};
  }

  OCTOPUS_HD InVec load(int64_t g) const {
    InVec v;
    v.m = *reinterpret_cast<const V*>(model_output + g);
    v.x = *reinterpret_cast<const V*>(sample + g);
    if (noise != nullptr) v.z = *reinterpret_cast<const V*>(noise + g);
    if (history != nullptr) v.h = *reinterpret_cast<const V*>(history + g);
    return v;
  }

  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec& v) const {
    V prev, x0v;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const acc_t z = noise != nullptr ? static_cast<acc_t>(v.z.v[k]) : acc_t(0);
      const acc_t h = history != nullptr ? static_cast<acc_t>(v.h.v[k]) : acc_t(0);
      acc_t x0;
      prev.v[k] = static_cast<scalar_t>(
          step(it, static_cast<acc_t>(v.x.v[k]), static_cast<acc_t>(v.m.v[k]), z, h, &x0));
      x0v.v[k] = static_cast<scalar_t>(x0);
    }
    *reinterpret_cast<V*>(prev_sample + g) = prev;
    if (pred_x0 != nullptr) *reinterpret_cast<V*>(pred_x0 + g) = x0v;
    if (history != nullptr && !it.skip) *reinterpret_cast<V*>(history + g) = x0v;
  }

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    const acc_t z = noise != nullptr ? static_cast<acc_t>(noise[g]) : acc_t(0);
    const acc_t h = history != nullptr ? static_cast<acc_t>(history[g]) : acc_t(0);
    acc_t x0;
    prev_sample[g] = static_cast<scalar_t>(
        step(it, static_cast<acc_t>(sample[g]), static_cast<acc_t>(model_output[g]), z, h, &x0));
    if (pred_x0 != nullptr) pred_x0[g] = static_cast<scalar_t>(x0);
    if (history != nullptr && !it.skip) history[g] = static_cast<scalar_t>(x0);
  }

 private:
  OCTOPUS_HD static acc_t step(const Item& it, acc_t x, acc_t m, acc_t z, acc_t h, acc_t* x0_out) {
    acc_t x0 = it.a * x + it.b * m;
    if (it.clip > acc_t(0)) x0 = x0 < -it.clip ? -it.clip : (x0 > it.clip ? it.clip : x0);
    *x0_out = x0;
    return it.p * x + it.q * x0 + it.r * m + it.s * z + it.u * h;
  }
};

}  // namespace octopus
