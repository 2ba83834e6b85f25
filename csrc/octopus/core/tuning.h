// Tuning constants of octopus's CUDA kernels, per GPU architecture, in one place (as CUB's
// policies): a small struct per op family, gathered in ArchTuning, and one ArchTuning per
// architecture in tuning_for().
//
// Two readers, one table, so they agree by construction:
//  - device code reads kTuning: the values of the architecture nvcc is compiling it for
//    (every kernel is compiled once per architecture of OCTOPUS_CUDA_ARCHITECTURES);
//  - host code that shapes a launch (threads per block, work per thread) reads
//    launch_tuning(): the values of the architecture whose code the current device runs
//    (the PTX version of octopus's kernels there, read as CUB reads it).
// So a value may differ between architectures only where it is read this way: never as a
// template argument chosen on the host (the host's instantiation would not exist in the
// device code) and never in host code through kTuning. octopus.kernel_tuning() shows both
// readers' values for a device; the CUDA tests compare them.
//
// Only Hopper's values were measured (H100, the benchmark and the register reports of
// sm_90); every other architecture uses them until it is measured. The vector width is not
// here: 16 bytes on every architecture octopus compiles for (the host checks alignment
// against it; see core/vec.h).
#pragma once

namespace octopus::cuda {

// The generic driver (core/driver_cuda.cuh) and the launches of octopus's other kernels.
struct DriverTuning {
  int threads;                 // per block, every kernel but the plan builder's and crop_resize's forward
  int min_blocks_per_sm;       // the driver's kernel is compiled for this many (caps registers)
  int max_unroll_per_element;  // vectors in flight per lane of per-element locators (an item index each)
};

// affine, clamp, threshold, power (ops/item_param_op.h): vectors in flight per lane.
struct ItemParamTuning {
  int unroll_uint8;           // uint8 input widens to 64 output bytes per vector
  int unroll_4byte_per_item;  // 4-byte elements, one parameter pair per item
  int unroll;                 // the rest (the per-channel form keeps a channel cursor)
};

// to_padded (ops/padding.cu) and from_padded (ops/padding.h).
struct PaddingTuning {
  int to_padded_unroll;    // vectors in flight per lane
  int to_padded_chunk;     // output elements per warp task (a multiple of every vector width)
  int to_padded_blocks_per_sm;  // blocks per multiprocessor launched
  int from_padded_unroll;  // vectors in flight per lane
  int from_padded_gather;  // elements a lane gathers per turn of its row cursor
};

// 3x3 stencils (ops/stencil.h).
struct StencilTuning {
  int unroll;
  int min_blocks_per_sm;     // the staged walk takes about 80 registers
  int stage_bytes_per_warp;  // shared memory per warp for staged rows
  int stage_load_unroll;     // 16-byte vectors in flight per lane while staging
};

// crop_resize (ops/crop_resize.cu) and the ragged crop functor (ops/crop_resize_ragged.h).
struct CropResizeTuning {
  int quad;               // neighbouring outputs per thread along x
  int rows_per_thread;    // output rows per thread
  int block_threads;      // the forward's threads per block at most (small blocks measured fastest)
  int backward_blocks_per_sm;  // blocks per multiprocessor launched by the backward
  int ragged_unroll;
  int ragged_min_blocks_per_sm;
};

// The fused sampler step (ops/sampler_step.h).
struct SamplerStepTuning {
  int unroll;
  int min_blocks_per_sm;          // the step without history and correction inputs
  int min_blocks_per_sm_general;  // the step that may read every input (~126 registers)
  int tiles_per_sm;               // tiled strategies: tiles shrink towards this many per multiprocessor ...
  int min_tile_elems;             // ... down to this many elements
};

// item_stats (ops/item_stats.cu) and tile_stats (ops/tile_stats.cu).
struct StatsTuning {
  int item_unroll_4byte;   // 16-byte vectors in flight per lane, elements of 4 bytes or more
  int item_unroll;         // ... of 1 and 2 bytes
  int item_blocks_per_sm;  // blocks per multiprocessor launched
  int tile_rows;           // rows a warp has in flight
  int tile_blocks_per_sm;  // blocks per multiprocessor over the whole image (tiles split to get there)
  int tile_max_splits;     // blocks per tile at most
};

// The device plan builder (core/plan.cu).
struct PlanTuning {
  int fused_threads;        // each block of the small-batch kernel scans every item's block count
  int fused_blocks_per_sm;  // ... and fills its share of the rows: this many blocks per multiprocessor at most
  int mark_threads;         // the lookup table's item starts
  int mark_blocks_per_sm;
  int fill_threads;         // the large-batch plan's rows
};

struct ArchTuning {
  DriverTuning driver;
  ItemParamTuning item_param;
  PaddingTuning padding;
  StencilTuning stencil;
  CropResizeTuning crop_resize;
  SamplerStepTuning sampler_step;
  StatsTuning stats;
  PlanTuning plan;
};

// Hopper (sm_90): measured on an H100.
inline constexpr ArchTuning kHopperTuning{
    DriverTuning{256, 4, 4},
    // From the register reports at 64 registers: the per-item forms do not spill.
    ItemParamTuning{2, 8, 4},
    PaddingTuning{4, 4096, 8, 2, 16},
    // 3 blocks per SM instead of 4: a few bytes spill at 80 registers, far more at 64,
    // which measured slower.
    StencilTuning{2, 3, 5632, 2},
    // Rows unrolled by 4 (80 registers for float32) measured faster than by 1 or 2; for
    // 224-wide outputs 56 threads per block took 0.38-0.39 ms per call, 112 0.43, 224 0.47.
    CropResizeTuning{4, 4, 64, 16, 2, 3},
    // Three blocks per SM measured as fast as four, whose 64-register cap spills more. For
    // 17-26 MB latents, fewer, longer tiles beat one per resident warp (each tile pays a
    // search and the coefficient math before its first load).
    SamplerStepTuning{2, 3, 2, 16, 512},
    StatsTuning{4, 2, 8, 2, 16, 64},
    PlanTuning{1024, 2, 256, 32, 256},
};

// What the kernels assume of any table.
constexpr bool tuning_is_valid(const ArchTuning& t) {
  const int warps = t.driver.threads / 32;
  return t.driver.threads % 32 == 0 && t.driver.threads <= 1024 && t.driver.max_unroll_per_element >= 1 &&
         t.padding.to_padded_chunk % 16 == 0 &&                    // whole vectors of every element size
         t.stencil.stage_bytes_per_warp * warps <= 48 * 1024 &&    // static shared memory
         t.crop_resize.block_threads <= t.driver.threads && t.plan.fused_threads % 32 == 0 &&
         t.plan.fused_threads <= 1024 && t.sampler_step.min_tile_elems % 16 == 0;
}
static_assert(tuning_is_valid(kHopperTuning));

// The tuning of an architecture (__CUDA_ARCH__ numbering: 750, 800, 860, 890, 900, ...).
constexpr ArchTuning tuning_for(int /*arch*/) { return kHopperTuning; }

#if defined(__CUDA_ARCH__)
inline constexpr int kCompiledArch = __CUDA_ARCH__;
#else
inline constexpr int kCompiledArch = 0;  // host code: not to be read there (launch_tuning())
#endif

// What device code reads.
inline constexpr ArchTuning kTuning = tuning_for(kCompiledArch);

// What the host reads to shape a launch on the current device (defined in core/tuning.cu).
const ArchTuning& launch_tuning();

// The architecture of the code the current device runs (__CUDA_ARCH__ numbering).
int launch_arch();

// kTuning as the current device's code has it (one tiny kernel; for checks, not launches).
ArchTuning compiled_tuning();

// Every value by name ("driver.threads", ...), in declaration order.
template <class Fn>
void for_each_tuning_value(const ArchTuning& t, Fn&& fn) {
  fn("driver.threads", t.driver.threads);
  fn("driver.min_blocks_per_sm", t.driver.min_blocks_per_sm);
  fn("driver.max_unroll_per_element", t.driver.max_unroll_per_element);
  fn("item_param.unroll_uint8", t.item_param.unroll_uint8);
  fn("item_param.unroll_4byte_per_item", t.item_param.unroll_4byte_per_item);
  fn("item_param.unroll", t.item_param.unroll);
  fn("padding.to_padded_unroll", t.padding.to_padded_unroll);
  fn("padding.to_padded_chunk", t.padding.to_padded_chunk);
  fn("padding.to_padded_blocks_per_sm", t.padding.to_padded_blocks_per_sm);
  fn("padding.from_padded_unroll", t.padding.from_padded_unroll);
  fn("padding.from_padded_gather", t.padding.from_padded_gather);
  fn("stencil.unroll", t.stencil.unroll);
  fn("stencil.min_blocks_per_sm", t.stencil.min_blocks_per_sm);
  fn("stencil.stage_bytes_per_warp", t.stencil.stage_bytes_per_warp);
  fn("stencil.stage_load_unroll", t.stencil.stage_load_unroll);
  fn("crop_resize.quad", t.crop_resize.quad);
  fn("crop_resize.rows_per_thread", t.crop_resize.rows_per_thread);
  fn("crop_resize.block_threads", t.crop_resize.block_threads);
  fn("crop_resize.backward_blocks_per_sm", t.crop_resize.backward_blocks_per_sm);
  fn("crop_resize.ragged_unroll", t.crop_resize.ragged_unroll);
  fn("crop_resize.ragged_min_blocks_per_sm", t.crop_resize.ragged_min_blocks_per_sm);
  fn("sampler_step.unroll", t.sampler_step.unroll);
  fn("sampler_step.min_blocks_per_sm", t.sampler_step.min_blocks_per_sm);
  fn("sampler_step.min_blocks_per_sm_general", t.sampler_step.min_blocks_per_sm_general);
  fn("sampler_step.tiles_per_sm", t.sampler_step.tiles_per_sm);
  fn("sampler_step.min_tile_elems", t.sampler_step.min_tile_elems);
  fn("stats.item_unroll_4byte", t.stats.item_unroll_4byte);
  fn("stats.item_unroll", t.stats.item_unroll);
  fn("stats.item_blocks_per_sm", t.stats.item_blocks_per_sm);
  fn("stats.tile_rows", t.stats.tile_rows);
  fn("stats.tile_blocks_per_sm", t.stats.tile_blocks_per_sm);
  fn("stats.tile_max_splits", t.stats.tile_max_splits);
  fn("plan.fused_threads", t.plan.fused_threads);
  fn("plan.fused_blocks_per_sm", t.plan.fused_blocks_per_sm);
  fn("plan.mark_threads", t.plan.mark_threads);
  fn("plan.mark_blocks_per_sm", t.plan.mark_blocks_per_sm);
  fn("plan.fill_threads", t.plan.fill_threads);
}
// A value added to a struct above is added to the list too.
static_assert(sizeof(ArchTuning) == 37 * sizeof(int), "for_each_tuning_value lists every value");

}  // namespace octopus::cuda
