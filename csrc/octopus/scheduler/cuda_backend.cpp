#include "octopus/scheduler/cuda_backend.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "octopus/scheduler/cuda_check.h"
#include "octopus/scheduler/green_context.h"
#include "octopus/scheduler/nvml.h"
#include "octopus/scheduler/stream_pool.h"

namespace octopus::scheduler {

using cuda_detail::check;
using cuda_detail::DeviceGuard;
using cuda_detail::RelaxedCaptureMode;

namespace {

// The process's streams and partitions, whichever CudaBackend (one per scheduler) made them:
// a scheduler made after another one ended takes its streams and green contexts again.
// Never destroyed (a static's destructor could run after a thread still using it).
struct ProcessStreams {
  detail::StreamPool streams;
  std::mutex partitions_mutex;
  // By device, then by the SMs each leaves free; never destroyed (see green_context.h).
  std::map<int, std::map<int, std::unique_ptr<GreenContextPartition>>> partitions;
  // Yield gates given back, by device and size, each with an event after the last write on
  // each of its writers: one is handed out again once they have all completed (a write still
  // queued could open a word its next scheduler closed). Without reuse every scheduler a
  // process made kept a device allocation for the life of the process.
  struct ReturnedGate {
    uint32_t* words = nullptr;
    std::vector<cudaEvent_t> written;
  };
  std::mutex gates_mutex;
  std::map<std::pair<int, int>, std::deque<ReturnedGate>> gates;
};

ProcessStreams& process_streams() {
  static ProcessStreams* streams = new ProcessStreams();
  return *streams;
}

}  // namespace

CudaBackend::CudaBackend(bool use_nvml) : use_nvml_(use_nvml) {
  const cudaError_t status = cudaGetDeviceCount(&device_count_);
  if (status != cudaSuccess || device_count_ == 0) {
    cudaGetLastError();  // clear the sticky "no device" error for the rest of the process
    throw std::runtime_error(std::string("octopus StreamScheduler: no CUDA device is available (") +
                             (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) +
                             "); use backend=\"simulated\" to run the scheduler without a GPU");
  }
  pci_bus_ids_.resize(static_cast<std::size_t>(device_count_));
  for (int d = 0; d < device_count_; ++d) {
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), d) == cudaSuccess) {
      pci_bus_ids_[static_cast<std::size_t>(d)] = bus_id;
    } else {
      cudaGetLastError();
    }
  }
}

int CudaBackend::multiprocessor_count(int device) {
  int count = 0;
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

StreamHandle CudaBackend::create_stream(int device, bool high_priority) {
  return process_streams().streams.take_or_make(detail::StreamPool::priority_kind(device, high_priority), [&] {
    DeviceGuard guard(device);
    RelaxedCaptureMode relaxed;
    int lowest = 0, greatest = 0;  // numerically lower is higher priority
    check(cudaDeviceGetStreamPriorityRange(&lowest, &greatest), "cudaDeviceGetStreamPriorityRange");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, high_priority ? greatest : lowest),
          "cudaStreamCreateWithPriority");
    return static_cast<StreamHandle>(stream);
  });
}

int CudaBackend::create_partition(int device, int reserved_sms) {
  ProcessStreams& p = process_streams();
  std::lock_guard<std::mutex> lock(p.partitions_mutex);
  RelaxedCaptureMode relaxed;
  auto& partition = p.partitions[device][reserved_sms];
  if (!partition) partition = GreenContextPartition::create(device, reserved_sms);
  return partition->sms();
}

StreamHandle CudaBackend::create_partition_stream(int device, int reserved_sms) {
  ProcessStreams& p = process_streams();
  return p.streams.take_or_make({device, reserved_sms}, [&] {
    std::lock_guard<std::mutex> lock(p.partitions_mutex);
    RelaxedCaptureMode relaxed;
    auto& by_reserve = p.partitions[device];
    const auto it = by_reserve.find(reserved_sms);
    if (it == by_reserve.end() || !it->second) {
      throw std::logic_error("octopus StreamScheduler: create_partition_stream before create_partition");
    }
    return it->second->create_stream();
  });
}

void CudaBackend::return_stream(int, StreamHandle stream) noexcept { process_streams().streams.give_back(stream); }

EventHandle CudaBackend::create_event(int device, bool timed) {
  DeviceGuard guard(device);
  RelaxedCaptureMode relaxed;
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, timed ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return event;
}

void CudaBackend::destroy_event(int, EventHandle event) noexcept {
  RelaxedCaptureMode relaxed;
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void CudaBackend::record_event(int, EventHandle event, StreamHandle stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}

bool CudaBackend::event_done(int, EventHandle event) {
  RelaxedCaptureMode relaxed;
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}

double CudaBackend::elapsed_s(int, EventHandle start, EventHandle end) {
  float ms = 0.0f;
  RelaxedCaptureMode relaxed;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
        "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

void CudaBackend::synchronize_event(int, EventHandle event) {
  RelaxedCaptureMode relaxed;
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}

void CudaBackend::stream_wait_event(int, StreamHandle stream, EventHandle event) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
}

MemoryInfo CudaBackend::memory_info(int device) {
  DeviceGuard guard(device);
  MemoryInfo info;
  RelaxedCaptureMode relaxed;
  check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

std::optional<double> CudaBackend::utilization(int device) {
  if (!use_nvml_) return std::nullopt;
  return Nvml::instance().utilization(pci_bus_ids_.at(static_cast<std::size_t>(device)));
}

uint32_t* CudaBackend::create_gate(int device, int words) {
#if CUDART_VERSION >= 12050
  std::call_once(write_value_once_, [this] {
    try {
      write_value_ = reinterpret_cast<void*>(
          cuda_detail::driver_entry_point<PFN_cuStreamWriteValue32_v11070>("cuStreamWriteValue32", 12000));
    } catch (const std::exception&) {
      write_value_ = nullptr;  // no gate: best-effort kernels do not yield on the device
    }
  });
  if (write_value_ == nullptr) return nullptr;
  DeviceGuard guard(device);
  RelaxedCaptureMode relaxed;
  void* memory = reused_gate(device, words);
  const std::size_t bytes = sizeof(uint32_t) * static_cast<std::size_t>(words);
  if (memory == nullptr) check(cudaMalloc(&memory, bytes), "cudaMalloc (the yield gate)");
  // Zeroed on a stream of its own: a device-wide synchronization would wait for whatever else
  // the device runs (and is not allowed while another thread captures a graph).
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (the yield gate)");
  const cudaError_t zeroed = cudaMemsetAsync(memory, 0, bytes, stream);
  const cudaError_t synced = zeroed == cudaSuccess ? cudaStreamSynchronize(stream) : zeroed;
  cudaStreamDestroy(stream);
  check(synced, "zeroing the yield gate");
  return static_cast<uint32_t*>(memory);
#else
  (void)device;
  (void)words;
  return nullptr;
#endif
}

void* CudaBackend::reused_gate(int device, int words) {
  ProcessStreams& p = process_streams();
  std::lock_guard<std::mutex> lock(p.gates_mutex);
  std::deque<ProcessStreams::ReturnedGate>& returned = p.gates[{device, words}];
  for (auto it = returned.begin(); it != returned.end(); ++it) {
    const bool written = std::all_of(it->written.begin(), it->written.end(),
                                     [&](const cudaEvent_t event) { return event_done(device, event); });
    if (!written) continue;
    for (const cudaEvent_t event : it->written) cudaEventDestroy(event);
    uint32_t* gate = it->words;
    returned.erase(it);
    return gate;
  }
  return nullptr;
}

void CudaBackend::return_gate(int device, uint32_t* gate, int words, const std::vector<StreamHandle>& writers) noexcept {
#if CUDART_VERSION >= 12050
  if (gate == nullptr) return;
  ProcessStreams::ReturnedGate returned{gate, {}};
  try {  // at interpreter exit the runtime may be going: then the gate is kept for ever, as before reuse
    DeviceGuard guard(device);
    RelaxedCaptureMode relaxed;
    for (const StreamHandle stream : writers) {
      cudaEvent_t event = nullptr;
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags (a returned gate)");
      returned.written.push_back(event);
      check(cudaEventRecord(event, static_cast<cudaStream_t>(stream)), "cudaEventRecord (a returned gate)");
    }
    ProcessStreams& p = process_streams();
    std::lock_guard<std::mutex> lock(p.gates_mutex);
    p.gates[{device, words}].push_back(std::move(returned));
  } catch (...) {
    cudaGetLastError();
    for (const cudaEvent_t e : returned.written) cudaEventDestroy(e);
  }
#else
  (void)device;
  (void)gate;
  (void)words;
  (void)writers;
#endif
}

void CudaBackend::write_gate(int, StreamHandle stream, uint32_t* word, uint32_t value) {
#if CUDART_VERSION >= 12050
  // A stream being captured would record the write in its graph instead of doing it; the
  // gate is left alone then (a lease's stream is captured only by a caller's own doing).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  const auto write = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(write_value_);
  const CUresult status = write(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), value,
                                CU_STREAM_WRITE_VALUE_DEFAULT);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error("octopus StreamScheduler: cuStreamWriteValue32 (the yield gate) failed with CUresult " +
                             std::to_string(static_cast<int>(status)));
  }
#else
  (void)stream;
  (void)word;
  (void)value;
#endif
}

}  // namespace octopus::scheduler
