#include "proto/trace_context.h"

#include <algorithm>
#include <random>

namespace dgmm {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// A lowercase hex digit's value, or -1 (uppercase is not valid in a
// traceparent).
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// `out.size()` bytes from twice as many hex digits at the start of `text`.
template <size_t N>
bool ReadHex(absl::string_view text, std::array<uint8_t, N>* out) {
  if (text.size() < 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexValue(text[2 * i]);
    const int lo = HexValue(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <size_t N>
std::string Hex(const std::array<uint8_t, N>& bytes) {
  std::string s(2 * N, '0');
  for (size_t i = 0; i < N; ++i) {
    s[2 * i] = kHex[bytes[i] >> 4];
    s[2 * i + 1] = kHex[bytes[i] & 0xf];
  }
  return s;
}

template <size_t N>
bool AllZero(const std::array<uint8_t, N>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng{[] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }()};
  return rng;
}

template <size_t N>
void FillRandom(std::array<uint8_t, N>* out) {
  do {
    for (size_t i = 0; i < N; i += 8) {
      uint64_t r = Rng()();
      for (size_t j = i; j < std::min(N, i + 8); ++j, r >>= 8) (*out)[j] = static_cast<uint8_t>(r);
    }
  } while (AllZero(*out));
}

}  // namespace

std::string ToHex(const TraceId& id) { return Hex(id); }
std::string ToHex(const SpanId& id) { return Hex(id); }

bool TraceContext::valid() const { return !AllZero(trace_id) && !AllZero(span_id); }
std::string TraceContext::trace_id_hex() const { return Hex(trace_id); }
std::string TraceContext::span_id_hex() const { return Hex(span_id); }
std::string TraceContext::flags_hex() const { return Hex(std::array<uint8_t, 1>{flags}); }

std::string TraceContext::Traceparent() const {
  std::string s = "00-";
  s += trace_id_hex();
  s += '-';
  s += span_id_hex();
  s += '-';
  s += flags_hex();
  return s;
}

std::optional<TraceContext> ParseTraceparent(absl::string_view value) {
  // version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2.
  constexpr size_t kV00Size = 55;
  if (value.size() < kV00Size) return std::nullopt;
  std::array<uint8_t, 1> version;
  if (!ReadHex(value, &version) || version[0] == 0xff) return std::nullopt;
  if (version[0] == 0 ? value.size() != kV00Size
                      : value.size() > kV00Size && value[kV00Size] != '-') {
    return std::nullopt;
  }
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
  TraceContext t;
  std::array<uint8_t, 1> flags;
  if (!ReadHex(value.substr(3), &t.trace_id) || !ReadHex(value.substr(36), &t.span_id) ||
      !ReadHex(value.substr(53), &flags)) {
    return std::nullopt;
  }
  t.flags = flags[0];
  if (!t.valid()) return std::nullopt;
  return t;
}

std::optional<TraceContext> ParseGrpcTraceBin(absl::string_view bytes) {
  // version 0, then (field id, value) pairs in field order.
  if (bytes.empty() || bytes[0] != 0) return std::nullopt;
  size_t at = 1;
  TraceContext t;
  auto field = [&](uint8_t id, uint8_t* dst, size_t size) {
    if (at >= bytes.size() || static_cast<uint8_t>(bytes[at]) != id) return false;
    if (bytes.size() - at - 1 < size) return false;
    std::copy_n(reinterpret_cast<const uint8_t*>(bytes.data()) + at + 1, size, dst);
    at += 1 + size;
    return true;
  };
  if (!field(0, t.trace_id.data(), t.trace_id.size())) return std::nullopt;
  if (!field(1, t.span_id.data(), t.span_id.size())) return std::nullopt;
  field(2, &t.flags, 1);  // optional; anything after it is ignored
  if (!t.valid()) return std::nullopt;
  return t;
}

std::string GrpcTraceBin(const TraceContext& context) {
  std::string s;
  s.reserve(29);
  s.push_back('\0');
  s.push_back('\0');
  s.append(reinterpret_cast<const char*>(context.trace_id.data()), context.trace_id.size());
  s.push_back('\1');
  s.append(reinterpret_cast<const char*>(context.span_id.data()), context.span_id.size());
  s.push_back('\2');
  s.push_back(static_cast<char>(context.flags));
  return s;
}

bool UsableTracestate(absl::string_view value) {
  if (value.empty() || value.size() > kMaxTracestateBytes) return false;
  return std::all_of(value.begin(), value.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

SpanId NewSpanId() {
  SpanId id;
  FillRandom(&id);
  return id;
}

TraceContext NewTraceContext() {
  TraceContext t;
  FillRandom(&t.trace_id);
  FillRandom(&t.span_id);
  return t;
}

}  // namespace dgmm
