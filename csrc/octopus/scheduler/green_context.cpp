#include "octopus/scheduler/green_context.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "octopus/scheduler/cuda_check.h"

namespace octopus::scheduler {

#if CUDART_VERSION >= 12050

namespace {

constexpr int kGreenContextDriver = 12050;  // cuGreenCtxStreamCreate is the newest call used

}  // namespace

using cuda_detail::cuda_version_text;
using cuda_detail::driver_entry_point;

struct GreenContextPartition::Driver {
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetDevResource_v12040 device_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_context_create = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 green_stream_create = nullptr;

  Driver() {
    error_name = driver_entry_point<PFN_cuGetErrorName_v6000>("cuGetErrorName", 6000);
    device_get = driver_entry_point<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000);
    device_resource = driver_entry_point<PFN_cuDeviceGetDevResource_v12040>("cuDeviceGetDevResource", 12040);
    split_by_count = driver_entry_point<PFN_cuDevSmResourceSplitByCount_v12040>("cuDevSmResourceSplitByCount", 12040);
    generate_desc = driver_entry_point<PFN_cuDevResourceGenerateDesc_v12040>("cuDevResourceGenerateDesc", 12040);
    green_context_create = driver_entry_point<PFN_cuGreenCtxCreate_v12040>("cuGreenCtxCreate", 12040);
    green_stream_create = driver_entry_point<PFN_cuGreenCtxStreamCreate_v12050>("cuGreenCtxStreamCreate", 12050);
  }

  void check(CUresult status, const char* what) const {
    if (status == CUDA_SUCCESS) return;
    const char* name = nullptr;
    if (error_name(status, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown error";
    throw std::runtime_error(std::string(what) + " failed: " + name + " (" + std::to_string(static_cast<int>(status)) + ")");
  }
};

std::unique_ptr<GreenContextPartition> GreenContextPartition::create(int device, int reserved_sms) {
  int driver_version = 0;
  cuda_detail::check(cudaDriverGetVersion(&driver_version), "cudaDriverGetVersion");
  if (driver_version < kGreenContextDriver) {
    throw std::runtime_error("SM partitions need green contexts, which need a CUDA " + cuda_version_text(kGreenContextDriver) +
                             " driver or newer; this driver supports CUDA " + cuda_version_text(driver_version));
  }
  auto driver = std::make_shared<const Driver>();
  cuda_detail::DeviceGuard guard(device);
  // A green context is made from the device's primary context; make sure it exists.
  cuda_detail::check(cudaFree(nullptr), "cudaFree(nullptr) (initializing the device's primary context)");

  CUdevice cu_device = 0;
  driver->check(driver->device_get(&cu_device, device), "cuDeviceGet");
  CUdevResource all{};
  driver->check(driver->device_resource(cu_device, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource(SM)");
  const int total = static_cast<int>(all.sm.smCount);
  // Drivers before CUDA 13 fill in the SM count only; then the minimum and the alignment
  // are those the driver documents for sm_90 (8 SMs, multiples of 8), which also hold for
  // older GPUs (their minima are smaller).
  const int alignment = all.sm.smCoscheduledAlignment > 0 ? static_cast<int>(all.sm.smCoscheduledAlignment) : 8;
  const int minimum = all.sm.minSmPartitionSize > 0 ? static_cast<int>(all.sm.minSmPartitionSize) : 8;
  const int wanted = (total - reserved_sms) / alignment * alignment;
  if (reserved_sms < 1 || wanted < minimum) {
    throw std::runtime_error("cannot keep " + std::to_string(reserved_sms) + " of the device's " + std::to_string(total) +
                             " SMs free: a green context needs at least " + std::to_string(minimum) +
                             " SMs, in multiples of " + std::to_string(alignment));
  }
  CUdevResource part{};
  unsigned int groups = 1;
  driver->check(driver->split_by_count(&part, &groups, &all, nullptr, 0, static_cast<unsigned int>(wanted)),
                "cuDevSmResourceSplitByCount");
  const int got = static_cast<int>(part.sm.smCount);
  if (groups != 1 || got < 1) {
    throw std::runtime_error("cuDevSmResourceSplitByCount made " + std::to_string(groups) + " group(s) of " +
                             std::to_string(got) + " SMs for a request of one group of " + std::to_string(wanted));
  }
  if (total - got < reserved_sms) {
    throw std::runtime_error("the driver rounded the partition up to " + std::to_string(got) + " of " +
                             std::to_string(total) + " SMs, which leaves fewer than the " + std::to_string(reserved_sms) +
                             " asked for free");
  }
  CUdevResourceDesc desc = nullptr;
  driver->check(driver->generate_desc(&desc, &part, 1), "cuDevResourceGenerateDesc");
  CUgreenCtx context = nullptr;
  driver->check(driver->green_context_create(&context, desc, cu_device, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");

  std::unique_ptr<GreenContextPartition> partition(new GreenContextPartition());
  partition->driver_ = std::move(driver);
  partition->context_ = context;
  partition->device_ = device;
  partition->sms_ = got;
  partition->device_sms_ = total;
  return partition;
}

StreamHandle GreenContextPartition::create_stream() {
  cuda_detail::DeviceGuard guard(device_);
  int lowest = 0, greatest = 0;  // numerically lower is higher priority
  cuda_detail::check(cudaDeviceGetStreamPriorityRange(&lowest, &greatest), "cudaDeviceGetStreamPriorityRange");
  CUstream stream = nullptr;
  driver_->check(driver_->green_stream_create(&stream, static_cast<CUgreenCtx>(context_), CU_STREAM_NON_BLOCKING, lowest),
                 "cuGreenCtxStreamCreate");
  return stream;
}

#else  // built with a CUDA toolkit older than 12.5: no green-context streams

struct GreenContextPartition::Driver {};

std::unique_ptr<GreenContextPartition> GreenContextPartition::create(int, int) {
  throw std::runtime_error("SM partitions need octopus built with CUDA 12.5 or newer (built with CUDA " +
                           std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) + ")");
}

StreamHandle GreenContextPartition::create_stream() {
  throw std::logic_error("octopus StreamScheduler: no green context");
}

#endif

}  // namespace octopus::scheduler
