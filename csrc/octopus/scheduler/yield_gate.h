// Best-effort kernels that step aside on the device. A best-effort kernel already running
// holds its SMs and DRAM bandwidth until it ends (the GPU does not preempt it), and a slice
// boundary on the host comes too late for a latency-critical job that arrives mid-slice. So
// each device has a *gate*: one word of device memory per latency-critical stream of the
// pool. A latency-critical lease closes its word on its own stream when it is granted (while
// its device's best-effort work yields) and opens it after its work, in stream order, when it
// is returned. octopus's ragged kernels launched on a best-effort stream of the pool read the
// gate between units of work: while a word is closed they stop claiming units and end, and a
// continuation, queued behind a one-warp wait for the gate to open, claims the rest
// (core/driver_cuda.cuh). Other kernels (a user's, cuBLAS's) never read it.
//
// This file is the meeting point of the two: the scheduler registers its best-effort streams
// with their device's gate; the driver asks, per launch, whether its stream yields now.
// Torch-free and CUDA-free: the words are an opaque device address here.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler {

// A word's value: the share of a best-effort kernel's warps that yield, out of kYieldAll
// (0: the gate is open). Latency-critical leases write kYieldAll.
constexpr uint32_t kYieldAll = 1024;

// What a yielding launch reads: `words` (device memory, `count` of them; the gate is closed
// while any is non-zero).
struct YieldGate {
  const uint32_t* words = nullptr;
  int count = 0;
};

// The longest a yielded launch waits on the device for the gate to open: twice the recent
// latency-critical holds on the device, within [kMinGateWaitS, kMaxGateWaitS] and never past the
// scheduler's best_effort_max_pause. A wait does not block the host, but while it runs the
// device is not idle: a device-wide synchronization (torch.cuda.synchronize(), a cudaFree of the
// caching allocator) waits for it, and the latency-critical holder that would open the gate may
// be the one synchronizing (its hold then includes the wait: hence the cap, or the bound would
// feed on itself), or be held up behind it. So a launch whose wait ran out waits no more: its
// later links run at once, the last one whatever the gate says.
constexpr double kGateWaitHolds = 2.0;
constexpr double kMinGateWaitS = 1e-3;
constexpr double kMaxGateWaitS = 10e-3;
// The recent holds: a maximum that decays by this factor with each latency-critical release.
constexpr double kGateHoldDecay = 0.98;

// One device's gate as the scheduler keeps it: whether its best-effort work yields now (the
// latency controller's step, or the pinned setting), the wait bound now, and how many launches
// yielded.
struct YieldGateState {
  YieldGate gate;
  std::atomic<bool> active{false};
  std::atomic<double> max_wait_s{kMinGateWaitS};
  std::atomic<int64_t> launches{0};  // yieldable launches on its streams
};

// The wait bound after a latency-critical hold of `hold_s` seconds, given the decaying maximum
// of the holds before it (updated in place) and the longest pause allowed (negative: none).
double gate_wait_after_hold(double hold_s, double& recent_max_hold_s, double max_pause_s);

// Registers best-effort `stream` with `state` (a stream is registered once; a scheduler's
// streams are its own). unregister_yield_streams removes every stream of `state`.
void register_yield_stream(StreamHandle stream, std::shared_ptr<YieldGateState> state);
void unregister_yield_streams(const YieldGateState* state);

// The gate of `stream` where it is a registered best-effort stream whose device yields now;
// null otherwise. (A launch that yields counts itself in its `launches`.)
std::shared_ptr<YieldGateState> yielding_gate(StreamHandle stream);

}  // namespace octopus::scheduler
