// Helpers for the standalone tuning programs in this folder: CHECK(cuda call) prints the error and exits;
// time_ms(launch) is the median of 30 event-timed runs after 5 untimed ones, in milliseconds (time_ms_flushed:
// L2 flushed before each);
// copy_bytes_per_second() times a 1 GiB device-to-device copy (bytes read + written), prints and returns it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                       \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

// flush_l2: a 256 MiB memset before each timed run (outside the timed events), so inputs start in DRAM.
template <typename Launch>
float time_ms(Launch launch, bool flush_l2 = false) {
  static void* flush = nullptr;
  constexpr size_t kFlushBytes = size_t{256} << 20;
  if (flush_l2 && flush == nullptr) CHECK(cudaMalloc(&flush, kFlushBytes));
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < 30; ++i) {
    if (flush_l2) CHECK(cudaMemsetAsync(flush, i, kFlushBytes));
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(end));
    CHECK(cudaEventSynchronize(end));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, end));
    times.push_back(ms);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(end));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename Launch>
float time_ms_flushed(Launch launch) {
  return time_ms(launch, true);
}

inline double copy_bytes_per_second() {
  const size_t bytes = size_t{1} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  const float ms = time_ms([&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  const double bps = 2.0 * bytes / (ms * 1e-3);
  printf("copy: %.3f ms, %.3f TB/s\n", ms, bps / 1e12);
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  return bps;
}
