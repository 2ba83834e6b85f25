// One diffusion sampler step for a whole batch, each sample at its own timestep.
//
// Every fused sampler (DDIM, DDPM, Euler, Euler ancestral, flow-matching Euler, DPM-Solver++
// 2M and its SDE variant, DPM-Solver++ 3M, UniPC bh2 of order 2 or 3) is, per sample, a linear update with coefficients that
// depend only on that sample's step (the stochastic ones add s * z, z the step's noise):
//   x0   = clip(a * x + b * m)                  (the predicted clean sample)
//   xs   = e * x + cl * L + c1 * h + c2 * h2 + cx * x0   (UniPC's corrected sample; else x)
//   prev = p * xs + q * x0 + r * m + s * z + u * h + v * h2
// with x the sample, m the model output, z noise, h and h2 the sample's x0 of its last two
// steps and L its last corrected sample (the multistep state: h becomes this step's x0,
// h2 the old h, L the new xs, plus cd * h2 for UniPC of order 3). item(i) finds sample i's row (its sampler: kind, prediction
// type, schedule, table, options), looks up its step in the row's schedule and computes
// the coefficients in double; the elements then cost a few fused multiply-adds. Samples of
// different samplers mix freely in one launch. A negative timestep leaves its sample as it
// is (prev = x, state untouched): samples that have finished, or not started yet, ride
// along in the batch. Run by the generic drivers.
#pragma once

#include <cmath>
#include <cstdint>

#include "octopus/core/grid_dependency.h"
#include "octopus/core/plan.h"
#include "octopus/core/tuning.h"
#include "octopus/core/vec.h"
#include "octopus/ops/sampler_step_layout.h"

// The per-sample coefficient math (double precision, log / exp / sqrt) is kept out of line
// so that its registers do not crowd the element loop's (which it would otherwise spill).
#if defined(__CUDACC__)
#define OCTOPUS_COEFFICIENTS __host__ __device__ __noinline__
#else
#define OCTOPUS_COEFFICIENTS inline
#endif

namespace octopus {

// The tables of one launch. Each sample reads row sample_rows[i] (without sample_rows: row i,
// or row 0 when there is one row); a row is a whole sampler: its kind, prediction type,
// schedule, table and options (sampler_step_layout.h names the columns).
struct SamplerParams {
  const double* __restrict__ timesteps;     // [N] each sample's current timestep
  const int64_t* __restrict__ sample_rows;  // [N] each sample's row, or null
  const double* __restrict__ schedules;     // [R, S] each row's timesteps, descending
  const double* __restrict__ tables;        // [R, W] ddim: alphas_cumprod; others: sigmas (length + 1)
  const int64_t* __restrict__ row_info;     // [R, RowInfo::kColumns]
  const double* __restrict__ row_scalars;   // [R, RowScalars::kColumns]
  int64_t rows, schedule_width, table_width;
};

// One row, read from the tables with every index clamped into them (on CUDA the op does not
// read the tables on the host to check them: bad contents give wrong numbers, never a bad
// memory access).
struct SamplerRow {
  SamplerKind kind;
  Prediction prediction;
  const double* schedule;  // `length` timesteps
  const double* table;     // `table_length` entries
  int64_t length, table_length, step_ratio;
  // The schedule index of the sample's timestep where the caller found it already (the CUDA
  // coefficient kernel searches with a whole warp); -1: step_index() searches.
  int64_t step = -1;
  bool final_first_order, clipped_model_output, final_second_order;
  double final_alpha_cumprod, eta, clip_range;
};

struct StepCoefficients {
  double a, b, p, q, r, s, u, clip;
  double e = 1.0, cl = 0.0, c1 = 0.0, c2 = 0.0, cx = 0.0;  // UniPC's corrector
  double v = 0.0;   // prev's h2 weight (UniPC of order 3)
  double cd = 0.0;  // the kept corrected sample is xs + cd * h2 (UniPC of order 3)
};

OCTOPUS_HD int64_t clamp_to(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

OCTOPUS_HD SamplerRow sampler_row(const SamplerParams& P, int64_t row) {
  const int64_t* info = P.row_info + row * RowInfo::kColumns;
  const double* scalars = P.row_scalars + row * RowScalars::kColumns;
  SamplerRow r;
  r.kind = static_cast<SamplerKind>(info[RowInfo::kKind]);
  r.prediction = static_cast<Prediction>(info[RowInfo::kPrediction]);
  r.schedule = P.schedules + row * P.schedule_width;
  r.table = P.tables + row * P.table_width;
  r.table_length = clamp_to(info[RowInfo::kTableLength], 1, P.table_width);
  // A sigma row reads sigmas[k + 1] for its last step k = length - 1 (tables are at least
  // two entries wide).
  const int64_t max_length =
      has_alphas_table(r.kind) ? P.schedule_width : clamp_to(r.table_length - 1, 1, P.schedule_width);
  r.length = clamp_to(info[RowInfo::kLength], 1, max_length);
  r.step_ratio = info[RowInfo::kStepRatio];
  r.final_first_order = info[RowInfo::kFinalFirstOrder] != 0;
  r.clipped_model_output = info[RowInfo::kClippedModelOutput] != 0;
  r.final_second_order = info[RowInfo::kFinalSecondOrder] != 0;
  r.final_alpha_cumprod = scalars[RowScalars::kFinalAlphaCumprod];
  r.eta = scalars[RowScalars::kEta];
  r.clip_range = scalars[RowScalars::kClipRange];
  return r;
}

// The index of the schedule entry nearest to t, from `lo`, the first index of a descending row
// of `length` entries whose entry is at most t (length: none is).
OCTOPUS_HD int64_t nearest_entry(const double* row, int64_t length, double t, int64_t lo) {
  if (lo >= length) return length - 1;
  if (lo > 0 && row[lo - 1] - t < t - row[lo]) return lo - 1;
  return lo;
}

// The index of the schedule entry nearest to t in a descending row of `length` entries.
OCTOPUS_HD int64_t schedule_index(const double* row, int64_t length, double t) {
  int64_t lo = 0, hi = length;  // first index with row[k] <= t
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (row[mid] > t) lo = mid + 1; else hi = mid;
  }
  return nearest_entry(row, length, t, lo);
}

// The schedule index of the sample's timestep t in its row.
OCTOPUS_HD int64_t step_index(const SamplerRow& R, double t) {
  return R.step >= 0 ? clamp_to(R.step, 0, R.length - 1) : schedule_index(R.schedule, R.length, t);
}

// Whether a kind's coefficients look its timestep up in its schedule (DDIM indexes its
// alphas table with the timestep itself).
OCTOPUS_HD bool searches_schedule(SamplerKind kind) { return kind != SamplerKind::DDIM; }

// diffusers' DDIM and DDPM steps work out their coefficients in float32 (alphas_cumprod is a
// float32 tensor): each operation is rounded to float32 here as there. A sum, difference,
// product or quotient of float32 values worked out in double and then rounded is the float32
// operation's result; a square root so worked out is the correctly rounded one, which torch's
// float32 square root on a CPU can miss by an ulp. Worked out in double instead (where
// 1 - alphas_cumprod[t] / alphas_cumprod[prev] cancels), a 100-step DDPM run ended 3e-5 away
// from diffusers' in float64; rounded so, 3e-7.
OCTOPUS_HD double rounded_f32(double x) { return static_cast<double>(static_cast<float>(x)); }

OCTOPUS_HD StepCoefficients ddim_coefficients(const SamplerRow& R, double t) {
  const int64_t ti = clamp_to(static_cast<int64_t>(llround(t)), 0, R.table_length - 1);
  const int64_t prev = ti - R.step_ratio;
  const double at = R.table[ti];
  const double ap = prev >= 0 ? R.table[clamp_to(prev, 0, R.table_length - 1)] : R.final_alpha_cumprod;
  const double bt = rounded_f32(1.0 - at), sa = rounded_f32(sqrt(at)), sb = rounded_f32(sqrt(bt));
  StepCoefficients k{};
  double c = 0.0, d = 1.0;  // eps = c * x + d * m
  switch (R.prediction) {
    case Prediction::Epsilon: k.a = 1.0 / sa; k.b = -sb / sa; c = 0.0; d = 1.0; break;
    case Prediction::Sample: k.a = 0.0; k.b = 1.0; c = 1.0 / sb; d = -sa / sb; break;
    default: k.a = sa; k.b = -sb; c = sb; d = sa; break;  // v-prediction
  }
  const double bp = rounded_f32(1.0 - ap);
  const double variance = rounded_f32(rounded_f32(bp / bt) * rounded_f32(1.0 - rounded_f32(at / ap)));
  const double std_dev = rounded_f32(rounded_f32(R.eta) * rounded_f32(sqrt(variance)));
  const double dir = rounded_f32(sqrt(rounded_f32(bp - rounded_f32(std_dev * std_dev))));
  k.clip = R.clip_range;
  k.q = rounded_f32(sqrt(ap));
  if (R.clipped_model_output) {  // eps recomputed from the (clipped) x0
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

// DDPM (variance "fixed_small"): prev = c_x0 * x0 + c_x * x + sqrt(variance) * z towards the
// schedule's next timestep (alphas_cumprod 1 after the last), no noise at timestep 0.
OCTOPUS_HD StepCoefficients ddpm_coefficients(const SamplerRow& R, double t) {
  const int64_t step = step_index(R, t);
  const int64_t ti = clamp_to(static_cast<int64_t>(llround(R.schedule[step])), 0, R.table_length - 1);
  const int64_t prev = step + 1 < R.length ? static_cast<int64_t>(llround(R.schedule[step + 1])) : -1;
  const double at = R.table[ti];
  const double ap = prev >= 0 ? R.table[clamp_to(prev, 0, R.table_length - 1)] : 1.0;
  const double bt = rounded_f32(1.0 - at), bp = rounded_f32(1.0 - ap);
  const double sa = rounded_f32(sqrt(at)), sb = rounded_f32(sqrt(bt));
  const double current_alpha = rounded_f32(at / ap), current_beta = rounded_f32(1.0 - current_alpha);
  StepCoefficients k{};
  switch (R.prediction) {
    case Prediction::Epsilon: k.a = 1.0 / sa; k.b = -sb / sa; break;
    case Prediction::Sample: k.a = 0.0; k.b = 1.0; break;
    default: k.a = sa; k.b = -sb; break;  // v-prediction
  }
  k.clip = R.clip_range;
  k.q = rounded_f32(rounded_f32(rounded_f32(sqrt(ap)) * current_beta) / bt);
  k.p = rounded_f32(rounded_f32(rounded_f32(sqrt(current_alpha)) * bp) / bt);
  const double variance = rounded_f32(rounded_f32(bp / bt) * current_beta), least = rounded_f32(1e-20);
  k.s = ti > 0 ? rounded_f32(sqrt(variance > least ? variance : least)) : 0.0;
  return k;
}

OCTOPUS_HD void alpha_sigma(double sigma, double* alpha, double* sigma_t) {
  *alpha = 1.0 / sqrt(sigma * sigma + 1.0);
  *sigma_t = sigma * *alpha;
}

// log(alpha) - log(sigma) of a sigma (+inf at sigma 0).
OCTOPUS_HD double lambda_of(double sigma) {
  double alpha, sigma_t;
  alpha_sigma(sigma, &alpha, &sigma_t);
  return log(alpha) - log(sigma_t);
}

OCTOPUS_HD StepCoefficients sigma_coefficients(const SamplerRow& R, double t) {
  const int64_t k = step_index(R, t), length = R.length;
  const double* sigmas = R.table;
  const double sigma = sigmas[k], next = sigmas[k + 1];
  StepCoefficients c{};
  if (R.kind == SamplerKind::FlowEuler) {  // prev = x + (sigma_next - sigma) * m
    c.a = 1.0; c.b = -sigma; c.p = 1.0; c.r = next - sigma;
    return c;
  }
  if (R.kind == SamplerKind::Euler || R.kind == SamplerKind::EulerAncestral) {
    switch (R.prediction) {
      case Prediction::Epsilon: c.a = 1.0; c.b = -sigma; break;
      case Prediction::Sample: c.a = 0.0; c.b = 1.0; break;
      default: c.a = 1.0 / (sigma * sigma + 1.0); c.b = -sigma / sqrt(sigma * sigma + 1.0); break;
    }
    double to = next;  // ancestral: down to sigma_down, then noise of sigma_up
    if (R.kind == SamplerKind::EulerAncestral) {
      const double up = sqrt(next * next * (sigma * sigma - next * next) / (sigma * sigma));
      to = sqrt(next * next - up * up);
      c.s = up;
    }
    const double dt = to - sigma;  // prev = x + (x - x0) / sigma * dt
    c.p = 1.0 + dt / sigma;
    c.q = -dt / sigma;
    return c;
  }
  // DPM-Solver++ (midpoint), second order where the history allows.
  double alpha_s0, sigma_s0, alpha_t, sigma_t;
  alpha_sigma(sigma, &alpha_s0, &sigma_s0);
  alpha_sigma(next, &alpha_t, &sigma_t);
  switch (R.prediction) {
    case Prediction::Epsilon: c.a = 1.0 / alpha_s0; c.b = -sigma_s0 / alpha_s0; break;
    case Prediction::Sample: c.a = 0.0; c.b = 1.0; break;
    default: c.a = alpha_s0; c.b = -sigma_s0; break;
  }
  const double lambda_t = log(alpha_t) - log(sigma_t);
  const double lambda_s0 = log(alpha_s0) - log(sigma_s0);
  const double h = lambda_t - lambda_s0;
  // The x0 weight of a first-order step, and the sample's: ODE (prev = sigma_t / sigma_s0 x
  // - phi x0) or SDE (prev = sigma_t / sigma_s0 e^-h x + alpha_t (1 - e^-2h) x0
  // + sigma_t sqrt(1 - e^-2h) z).
  const bool sde = R.kind == SamplerKind::DPMSolverPP2MSDE;
  const double weight = sde ? alpha_t * (1.0 - exp(-2.0 * h)) : -alpha_t * (exp(-h) - 1.0);  // as diffusers
  c.p = sde ? sigma_t / sigma_s0 * exp(-h) : sigma_t / sigma_s0;
  c.q = weight;
  if (sde) c.s = sigma_t * sqrt(1.0 - exp(-2.0 * h));
  const bool first_order = k == 0 || (k == length - 1 && R.final_first_order);
  const bool third_order = R.kind == SamplerKind::DPMSolverPP3M && !first_order && k >= 2 &&
                           !(k == length - 2 && R.final_second_order);
  if (third_order) {
    // D0 = m0 (this x0), D1_0 = (m0 - m1) / r0, D1_1 = (m1 - m2) / r1 (m1 = h, m2 = h2),
    // D1 = D1_0 + r0 / (r0 + r1) (D1_0 - D1_1), D2 = (D1_0 - D1_1) / (r0 + r1);
    // prev = sigma_t / sigma_s0 x + A D0 + B D1 + C D2, expanded into m0, m1, m2. The m2
    // term rides on xs = x + c2 h2 (p != 0 here: a final sigma of 0 makes the last step first order).
    const double lambda_s1 = lambda_of(sigmas[k - 1]), lambda_s2 = lambda_of(sigmas[k - 2]);
    const double r0 = (lambda_s0 - lambda_s1) / h, r1 = (lambda_s1 - lambda_s2) / h;
    const double em1 = exp(-h) - 1.0;
    const double A = -alpha_t * em1, B = alpha_t * (em1 / h + 1.0), C = -alpha_t * ((em1 + h) / (h * h) - 0.5);
    const double rs = r0 + r1;
    c.q = A + B / r0 + B / rs + C / (r0 * rs);
    c.u = B * (-1.0 / r0 + r0 / rs * (-1.0 / r0 - 1.0 / r1)) + C * (-1.0 / r0 - 1.0 / r1) / rs;
    c.c2 = (B * r0 / (rs * r1) + C / (r1 * rs)) / c.p;
  } else if (!first_order) {
    double alpha_s1, sigma_s1;
    alpha_sigma(sigmas[k - 1], &alpha_s1, &sigma_s1);
    const double r0 = (lambda_s0 - (log(alpha_s1) - log(sigma_s1))) / h;
    c.q = weight * (1.0 + 0.5 / r0);  // D0 = x0, D1 = (x0 - h) / r0
    c.u = -0.5 * weight / r0;
  }
  return c;
}

// Solves the n x n system A x = b (n <= 3) by elimination with partial pivoting (UniPC's
// R rho = b, as diffusers solves it with torch.linalg.solve).
OCTOPUS_HD void solve_small(int n, double A[3][3], double b[3], double x[3]) {
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r) pivot = fabs(A[r][c]) > fabs(A[pivot][c]) ? r : pivot;
    for (int j = 0; j < n; ++j) {
      const double t = A[c][j]; A[c][j] = A[pivot][j]; A[pivot][j] = t;
    }
    const double t = b[c]; b[c] = b[pivot]; b[pivot] = t;
    for (int r = c + 1; r < n; ++r) {
      const double f = A[r][c] / A[c][c];
      for (int j = c; j < n; ++j) A[r][j] -= f * A[c][j];
      b[r] -= f * b[c];
    }
  }
  for (int r = n - 1; r >= 0; --r) {
    double v = b[r];
    for (int j = r + 1; j < n; ++j) v -= A[r][j] * x[j];
    x[r] = v / A[r][r];
  }
}

// One UniPC update (bh2, predict_x0) of `order` from sigmas[from] to sigmas[to]: with
// m0 = the x0 at `from` and m_i = the x0 i steps before it (i < order), and for the corrector
// m_t = the x0 at `to`,
//   x_to = (sigma_t / sigma_0) x - w m0 - w (sum_i rho_i (m_i - m0) / r_i [+ rho_t (m_t - m0)])
// with w = alpha_t (e^-h - 1) and r_i = (lambda(from - i) - lambda(from)) / h. weights[0] is
// m0's weight, weights[i] m_i's; the corrector's m_t weight is weights[order].
OCTOPUS_HD void unipc_update(const double* sigmas, int64_t from, int64_t to, int order, bool corrector,
                             double* x_weight, double weights[4]) {
  double alpha_t, sigma_t, alpha_0, sigma_0;
  alpha_sigma(sigmas[to], &alpha_t, &sigma_t);
  alpha_sigma(sigmas[from], &alpha_0, &sigma_0);
  const double lambda_0 = lambda_of(sigmas[from]);
  const double h = lambda_of(sigmas[to]) - lambda_0;
  const double w = alpha_t * expm1(-h);  // alpha_t * B_h, and alpha_t * h_phi_1 (bh2)
  *x_weight = sigma_t / sigma_0;
  for (int i = 0; i < 4; ++i) weights[i] = 0.0;
  weights[0] = -w;
  double r[3] = {1.0, 1.0, 1.0};  // r_1 .. r_{order-1}, then 1 (the corrector's m_t)
  for (int i = 1; i < order; ++i) r[i - 1] = (lambda_of(sigmas[from - i]) - lambda_0) / h;
  // b_i = i! phi_{i+1}(h) h^-i / B_h terms, as diffusers builds them.
  const double hh = -h, b_h = expm1(hh);
  double h_phi_k = expm1(hh) / hh - 1.0, factorial = 1.0, b[3] = {0.0, 0.0, 0.0};
  for (int i = 1; i <= order && i <= 3; ++i) {
    b[i - 1] = h_phi_k * factorial / b_h;
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1.0 / factorial;
  }
  double rho[3] = {0.0, 0.0, 0.0};
  const int unknowns = corrector ? order : order - 1;  // the predictor has no m_t
  if (corrector && order == 1) {
    rho[0] = 0.5;  // diffusers' order-1 corrector
  } else if (!corrector && order == 2) {
    rho[0] = 0.5;  // diffusers' order-2 predictor
  } else if (unknowns > 0) {
    double A[3][3];
    for (int row = 0; row < unknowns; ++row) {
      for (int col = 0; col < unknowns; ++col) A[row][col] = row == 0 ? 1.0 : (row == 1 ? r[col] : r[col] * r[col]);
    }
    double x[3];
    solve_small(unknowns, A, b, x);
    for (int i = 0; i < unknowns; ++i) rho[i] = x[i];
  }
  for (int i = 1; i < order; ++i) {  // - w rho_i (m_i - m0) / r_i
    weights[i] = -w * rho[i - 1] / r[i - 1];
    weights[0] += w * rho[i - 1] / r[i - 1];
  }
  if (corrector) {  // - w rho_t (m_t - m0)
    weights[order] = -w * rho[order - 1];
    weights[0] += w * rho[order - 1];
  }
}

// UniPC (bh2, predict_x0, solver order 2 or 3): the corrector of the previous step's
// prediction with this model output, then the predictor. Step k's order is
// min(solver order, k + 1, and with lower_order_final length - k). An order-3 corrector's
// oldest x0 (three steps back) is not in the state: the step before folds its term into the
// corrected sample it keeps (L = xs + cd * h2, cd = that weight over the next step's cl).
OCTOPUS_HD StepCoefficients unipc_coefficients(const SamplerRow& R, double t) {
  const int64_t k = step_index(R, t), length = R.length;
  const double* sigmas = R.table;
  const int64_t solver_order = R.kind == SamplerKind::UniPC3 ? 3 : 2;
  auto order_at = [&](int64_t step) {
    int64_t o = solver_order;
    if (R.final_first_order && length - step < o) o = length - step;  // lower_order_final
    return static_cast<int>(o < step + 1 ? o : step + 1);
  };
  StepCoefficients c{};
  double alpha_s, sigma_s;
  alpha_sigma(sigmas[k], &alpha_s, &sigma_s);
  switch (R.prediction) {  // x0 from the model output at sigma_k
    case Prediction::Epsilon: c.a = 1.0 / alpha_s; c.b = -sigma_s / alpha_s; break;
    case Prediction::Sample: c.a = 0.0; c.b = 1.0; break;
    default: c.a = alpha_s; c.b = -sigma_s; break;
  }
  double weights[4];
  if (k > 0) {  // corrector: xs from L, m0 = h = x0_{k-1}, m1 = h2 = x0_{k-2} (m2 rides on L), x0
    const int order = order_at(k - 1);
    unipc_update(sigmas, k - 1, k, order, true, &c.cl, weights);
    c.e = 0.0;
    c.c1 = weights[0];
    c.c2 = order >= 2 ? weights[1] : 0.0;
    c.cx = weights[order];
  }
  // predictor from xs: m0 = x0, m1 = h, m2 = h2
  const int order = order_at(k);
  unipc_update(sigmas, k, k + 1, order, false, &c.p, weights);
  c.q = weights[0];
  c.u = weights[1];
  c.v = weights[2];
  if (k + 1 < length && order_at(k) == 3) {  // the next corrector's x0_{k-2} term, on L
    double cl;
    unipc_update(sigmas, k, k + 1, 3, true, &cl, weights);
    c.cd = weights[2] / cl;
  }
  return c;
}

// Sample i's row.
OCTOPUS_HD int64_t sample_row(const SamplerParams& P, int64_t i) {
  return P.sample_rows != nullptr ? clamp_to(P.sample_rows[i], 0, P.rows - 1) : (P.rows == 1 ? 0 : i);
}

// Sample i's coefficients at timestep t from its row (out of line: see OCTOPUS_COEFFICIENTS);
// `step` its schedule index where the caller found it (-1: searched here).
OCTOPUS_COEFFICIENTS StepCoefficients step_coefficients(const SamplerParams& P, int64_t i, double t, int64_t step) {
  SamplerRow r = sampler_row(P, sample_row(P, i));
  r.step = step;
  switch (r.kind) {
    case SamplerKind::DDIM: return ddim_coefficients(r, t);
    case SamplerKind::DDPM: return ddpm_coefficients(r, t);
    case SamplerKind::UniPC:
    case SamplerKind::UniPC3: return unipc_coefficients(r, t);
    default: return sigma_coefficients(r, t);
  }
}

// The fused sampler step's tuning (core/tuning.h).
struct SamplerStepTuning {
  int unroll;                     // vectors in flight per lane and input (the step without correction inputs)
  int unroll_general;             // ... for the step that may read every input
  int min_blocks_per_sm;          // the step without history and correction inputs
  int min_blocks_per_sm_general;  // the step that may read every input (~126 registers)
  int tiles_per_sm;               // tiled strategies: tiles shrink towards this many per multiprocessor ...
  int min_tile_elems;             // ... down to this many elements

  static constexpr const char* kFamily = "sampler_step";
  // Hopper (sm_90), measured on an H100: for 17-26 MB latents, fewer, longer tiles beat one per
  // resident warp (each tile pays a search and the coefficient math before its first load), so
  // a launch has about two blocks per SM and each warp's own loads in flight set its speed:
  // four vectors per input and lane at two blocks per SM (128 registers; ptxas: fp32 spills
  // 56/92 -> 0-20/28 bytes stored/loaded) beat two at three (DDIM 0.026 -> 0.023 ms a step,
  // DPM-Solver++ 2M 0.041 -> 0.040, benchmarks/JOURNAL.md); the general step keeps two (four
  // spill its six inputs).
  // Every architecture until it is measured.
  static constexpr SamplerStepTuning for_arch(int /*arch*/) { return SamplerStepTuning{4, 2, 2, 2, 16, 512}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("unroll", unroll);
    fn("unroll_general", unroll_general);
    fn("min_blocks_per_sm", min_blocks_per_sm);
    fn("min_blocks_per_sm_general", min_blocks_per_sm_general);
    fn("tiles_per_sm", tiles_per_sm);
    fn("min_tile_elems", min_tile_elems);
  }
  constexpr bool valid() const { return min_tile_elems % 16 == 0; }
};
static_assert(SamplerStepTuning::for_arch(900).valid());

// The optional latents a step functor reads. The common sets (none: DDIM with eta 0, Euler,
// flow Euler; noise: DDIM with eta > 0; history: DPM-Solver++) are compile-time, so that their
// functors hold registers for their own inputs only (three blocks per SM); Any checks every
// pointer at run time (UniPC, and launches that mix samplers: the union of their inputs).
enum class StepInputs { None, Noise, History, Any };

// Words of one sample's Item in an item table (15 coefficients and the skip flag).
constexpr int kItemWords = 16;

// kItemTable: item(i) reads sample i's Item from `item_table` (written before the step by
// sampler_item_table_kernel, from the same functor without it), so the step kernel holds no
// call to the coefficient math: fewer registers, and its first loads are not held behind it.
template <typename scalar_t, typename acc_t, StepInputs kInputs, bool kItemTable = false>
struct SamplerStepOp {
  static constexpr bool kMayNoise = kInputs == StepInputs::Noise || kInputs == StepInputs::Any;
  static constexpr bool kMayHistory = kInputs == StepInputs::History || kInputs == StepInputs::Any;
  static constexpr bool kMayCorrect = kInputs == StepInputs::Any;  // history2 and last_sample
  static constexpr int kVec = 16 / sizeof(scalar_t);
  static constexpr SamplerStepTuning kTuning = cuda::kPolicy<SamplerStepTuning>;
  static constexpr int kUnroll = kInputs == StepInputs::Any ? kTuning.unroll_general : kTuning.unroll;
  // Two vectors of up to six inputs in flight per lane (the general functor) need ~126
  // registers, four of two or three inputs (the others) about as many: both are compiled for
  // their own blocks per SM.
  static constexpr int kMinBlocksPerSm =
      kInputs == StepInputs::Any ? kTuning.min_blocks_per_sm_general : kTuning.min_blocks_per_sm;
  // A sample's latents are never a small item: plan runs (never built for them) are walked.
  static constexpr bool kLanesFindItems = false;
  // Its launches (a sampler's steps, mostly replayed from CUDA graphs) are not best-effort
  // work: no yielding variant of these kernels is compiled.
  static constexpr bool kYieldsOnDevice = false;
  // Reading its Items from the table the kernel before it writes, the step's kernel begins
  // while that one runs: its launch and first loads overlap the coefficient math (a few us a
  // step on an H200, a fifth of a DPM-Solver++ step; core/grid_dependency.h).
  static constexpr bool kWaitsForPrimary = kItemTable;
  using V = Vec<scalar_t, kVec>;
  struct InVec {
    V m, x, z, h, h2, l;
  };
  struct Item {
    acc_t a, b, p, q, r, s, u, clip, e, cl, c1, c2, cx, v, cd;
    bool skip;  // negative timestep: prev = x, history untouched
  };

  const scalar_t* __restrict__ model_output;
  const scalar_t* __restrict__ sample;
  const scalar_t* __restrict__ noise;  // null: no noise term
  scalar_t* __restrict__ history;      // null: no history (read, then overwritten with x0)
  scalar_t* __restrict__ history2;     // UniPC: the x0 before that (becomes the old history)
  scalar_t* __restrict__ last_sample;  // UniPC: the last corrected sample (becomes xs)
  scalar_t* __restrict__ prev_sample;
  scalar_t* __restrict__ pred_x0;      // null: not wanted
  SamplerParams params;
  const acc_t* __restrict__ item_table = nullptr;  // kItemTable: [N, kItemWords]
  using Acc = acc_t;

  OCTOPUS_HD Item item(int64_t i) const {
    if constexpr (kItemTable) {
      wait_for_primary();
      constexpr int kPer = 16 / sizeof(acc_t);  // 16-byte loads: a row is 64 or 128 bytes
      using Words = Vec<acc_t, kPer>;
      Words r[kItemWords / kPer];
#pragma unroll
      for (int k = 0; k < kItemWords / kPer; ++k) r[k] = reinterpret_cast<const Words*>(item_table + i * kItemWords)[k];
      auto w = [&](int k) { return r[k / kPer].v[k % kPer]; };
      return Item{w(0), w(1), w(2),  w(3),  w(4),  w(5),  w(6),  w(7),
                  w(8), w(9), w(10), w(11), w(12), w(13), w(14), w(15) != acc_t(0)};
    } else {
      return computed_item(i);
    }
  }

  // Sample i's Item as a row of an item table (`step`: as step_coefficients takes it).
  OCTOPUS_HD void write_item(int64_t i, acc_t* table, int64_t step = -1) const {
    const Item it = computed_item(i, step);
    const acc_t w[kItemWords] = {it.a, it.b, it.p, it.q, it.r, it.s,  it.u,  it.clip,
                                 it.e, it.cl, it.c1, it.c2, it.cx, it.v, it.cd, acc_t(it.skip ? 1 : 0)};
    for (int k = 0; k < kItemWords; ++k) table[i * kItemWords + k] = w[k];
  }

  // The same functor reading its Items from `table`.
  SamplerStepOp<scalar_t, acc_t, kInputs, true> with_item_table(const acc_t* table) const {
    return {model_output, sample, noise, history, history2, last_sample, prev_sample, pred_x0, params, table};
  }

  OCTOPUS_HD Item computed_item(int64_t i, int64_t step = -1) const {
    const double t = params.timesteps[i];
    if (!(t >= 0.0)) {
      return Item{acc_t(1), acc_t(0), acc_t(1), acc_t(0), acc_t(0), acc_t(0), acc_t(0),
                  acc_t(0), acc_t(1), acc_t(0), acc_t(0), acc_t(0), acc_t(0), acc_t(0), acc_t(0), true};
    }
    const StepCoefficients c = step_coefficients(params, i, t, step);
    auto f = [](double v) { return static_cast<acc_t>(v); };
    return Item{f(c.a), f(c.b), f(c.p), f(c.q), f(c.r), f(reads_noise() ? c.s : 0.0),
                f(reads_history() ? c.u : 0.0), f(c.clip), f(c.e), f(c.cl), f(c.c1), f(c.c2), f(c.cx), f(c.v), f(c.cd),
                false};
  }

  OCTOPUS_HD InVec load(int64_t g) const {
    InVec v;
    v.m = *reinterpret_cast<const V*>(model_output + g);
    v.x = *reinterpret_cast<const V*>(sample + g);
    if (reads_noise()) v.z = *reinterpret_cast<const V*>(noise + g);
    if (reads_history()) v.h = *reinterpret_cast<const V*>(history + g);
    if (reads_history2()) v.h2 = *reinterpret_cast<const V*>(history2 + g);
    if (reads_last_sample()) v.l = *reinterpret_cast<const V*>(last_sample + g);
    return v;
  }

  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec& v) const {
    V prev, x0v, xsv;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      acc_t x0, xs;
      prev.v[k] = static_cast<scalar_t>(step(it, static_cast<acc_t>(v.x.v[k]), static_cast<acc_t>(v.m.v[k]),
                                             reads_noise() ? acc(v.z.v[k]) : acc_t(0),
                                             reads_history() ? acc(v.h.v[k]) : acc_t(0),
                                             reads_history2() ? acc(v.h2.v[k]) : acc_t(0),
                                             reads_last_sample() ? acc(v.l.v[k]) : acc_t(0), &x0, &xs));
      x0v.v[k] = static_cast<scalar_t>(x0);
      xsv.v[k] = static_cast<scalar_t>(xs);
    }
    store_vec(prev_sample + g, prev);
    if (pred_x0 != nullptr) store_vec(pred_x0 + g, x0v);
    if (it.skip) return;
    if (reads_history2()) store_vec(history2 + g, v.h);
    if (reads_history()) store_vec(history + g, x0v);
    if (reads_last_sample()) store_vec(last_sample + g, xsv);
  }

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    acc_t x0, xs;
    const scalar_t h = reads_history() ? history[g] : scalar_t(0);
    prev_sample[g] = static_cast<scalar_t>(
        step(it, static_cast<acc_t>(sample[g]), static_cast<acc_t>(model_output[g]),
             reads_noise() ? acc(noise[g]) : acc_t(0), acc(h), reads_history2() ? acc(history2[g]) : acc_t(0),
             reads_last_sample() ? acc(last_sample[g]) : acc_t(0), &x0, &xs));
    if (pred_x0 != nullptr) pred_x0[g] = static_cast<scalar_t>(x0);
    if (it.skip) return;
    if (reads_history2()) history2[g] = h;
    if (reads_history()) history[g] = static_cast<scalar_t>(x0);
    if (reads_last_sample()) last_sample[g] = static_cast<scalar_t>(xs);
  }

 private:
  OCTOPUS_HD static acc_t acc(scalar_t v) { return static_cast<acc_t>(v); }
  // Whether the functor reads each optional latent: false at compile time where it cannot.
  OCTOPUS_HD bool reads_noise() const { return kMayNoise && noise != nullptr; }
  OCTOPUS_HD bool reads_history() const { return kMayHistory && history != nullptr; }
  OCTOPUS_HD bool reads_history2() const { return kMayCorrect && history2 != nullptr; }
  OCTOPUS_HD bool reads_last_sample() const { return kMayCorrect && last_sample != nullptr; }

  OCTOPUS_HD static acc_t step(const Item& it, acc_t x, acc_t m, acc_t z, acc_t h, acc_t h2, acc_t l, acc_t* x0_out,
                               acc_t* xs_out) {
    acc_t x0 = it.a * x + it.b * m;
    if (it.clip > acc_t(0)) x0 = x0 < -it.clip ? -it.clip : (x0 > it.clip ? it.clip : x0);
    // Only UniPC corrects (e = 1 and the rest 0 for every other sampler).
    const acc_t xs = kMayCorrect ? it.e * x + it.cl * l + it.c1 * h + it.c2 * h2 + it.cx * x0 : x;
    *x0_out = x0;
    *xs_out = kMayCorrect ? xs + it.cd * h2 : xs;  // the corrected sample kept (UniPC 3: with the next step's h2 term)
    acc_t prev = it.p * xs + it.q * x0 + it.r * m;
    if constexpr (kMayNoise) prev += it.s * z;
    if constexpr (kMayHistory) prev += it.u * h;
    if constexpr (kMayCorrect) prev += it.v * h2;
    return prev;
  }
};

}  // namespace octopus
