#include "tests/gpu/gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>

namespace dgmm::testing {
namespace {

double Load(DType t, const std::byte* base, int64_t i) {
  if (t == DType::kFloat32) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  }
  double v;
  std::memcpy(&v, base + i * 8, 8);
  return v;
}

}  // namespace

std::vector<std::byte> RandomElements(DType t, int64_t count, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mag(0.5, 2.0);
  std::vector<std::byte> out(static_cast<size_t>(count) * ElementSize(t));
  for (int64_t i = 0; i < count; ++i) {
    const double v = (gen() & 1) ? mag(gen) : -mag(gen);
    if (t == DType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(out.data() + i * 4, &f, 4);
    } else {
      std::memcpy(out.data() + i * 8, &v, 8);
    }
  }
  return out;
}

std::vector<std::byte> NaNElements(DType t, int64_t count) {
  std::vector<std::byte> out(static_cast<size_t>(count) * ElementSize(t));
  for (int64_t i = 0; i < count; ++i) {
    if (t == DType::kFloat32) {
      const float f = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(out.data() + i * 4, &f, 4);
    } else {
      const double v = std::numeric_limits<double>::quiet_NaN();
      std::memcpy(out.data() + i * 8, &v, 8);
    }
  }
  return out;
}

double MaxRelativeError(const Problem& p, const std::byte* a,
                        const std::byte* d, const std::byte* got) {
  double worst = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const int64_t i =
          p.layout == Layout::kRowMajor ? r * p.cols + c : c * p.rows + r;
      const double scale = Load(p.dtype, d, p.side == Side::kRight ? c : r);
      const double want = Load(p.dtype, a, i) * scale;
      const double g = Load(p.dtype, got, i);
      if (std::isnan(g)) return std::numeric_limits<double>::infinity();
      worst = std::max(worst, std::abs(g - want) / std::abs(want));
    }
  }
  return worst;
}

double Tolerance(DType t) {
  return t == DType::kFloat32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -51);
}

cuda::CudaDevice* SharedDevice(const CudaOptions& options, std::string* why) {
  static std::mutex mu;
  static auto* cache =
      new std::map<std::tuple<int, int64_t, int, bool>, cuda::CudaDevice*>();
  static std::string* none_reason = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (none_reason != nullptr) {
    *why = *none_reason;
    return nullptr;
  }
  const auto key =
      std::make_tuple(options.streams, options.tile_bytes,
                      options.staging_buffers, options.measure_backend_order);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  std::string reason;
  auto devices = CreateCudaDevices(options, &reason);
  if (!devices.ok()) {
    *why = std::string(devices.status().message());
    return nullptr;
  }
  if (devices->empty()) {
    none_reason = new std::string(reason);
    *why = reason;
    return nullptr;
  }
  // Keep device 0; the others close now.
  auto* device = static_cast<cuda::CudaDevice*>(devices->front().release());
  (*cache)[key] = device;
  return device;
}

}  // namespace dgmm::testing
