// LD_PRELOAD shim that counts the bytes a process copies with memcpy and
// memmove (and their _chk variants), to measure how many times each payload
// byte is copied in user space (docs/architecture.md, "Copies per byte").
//
//   DGMM_COPYCOUNT_OUT=/tmp/copies.txt LD_PRELOAD=build/bench/libstream_bench_copycount.so \
//     build/service/dgmm-server ...
//
// At exit the process appends one line to $DGMM_COPYCOUNT_OUT (stderr when
// unset): "copycount pid=P large_bytes=B large_calls=C all_bytes=A", where
// large counts copies of at least 64 KiB (payload-sized: every payload copy
// of a 4 MiB block is one or a few of these; headers and small protobuf
// fields are not) and all counts every copy. Copies made inside libc itself
// (realloc, stdio) and by the kernel (socket reads and writes) are not seen.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr size_t kLarge = size_t{64} << 10;
std::atomic<unsigned long long> large_bytes{0};
std::atomic<unsigned long long> large_calls{0};
std::atomic<unsigned long long> all_bytes{0};

using CopyFn = void* (*)(void*, const void*, size_t);

void Count(size_t n) {
  all_bytes.fetch_add(n, std::memory_order_relaxed);
  if (n >= kLarge) {
    large_bytes.fetch_add(n, std::memory_order_relaxed);
    large_calls.fetch_add(1, std::memory_order_relaxed);
  }
}

CopyFn Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) std::abort();
  return reinterpret_cast<CopyFn>(f);
}

struct Report {
  ~Report() { Write(); }
  void Write() {
    const char* path = std::getenv("DGMM_COPYCOUNT_OUT");
    FILE* f = path != nullptr ? std::fopen(path, "a") : stderr;
    if (f == nullptr) return;
    std::fprintf(f, "copycount pid=%d large_bytes=%llu large_calls=%llu all_bytes=%llu\n",
                 static_cast<int>(getpid()), large_bytes.load(), large_calls.load(),
                 all_bytes.load());
    if (f != stderr) std::fclose(f);
  }
} report;

}  // namespace

extern "C" {

void* memcpy(void* dst, const void* src, size_t n) {
  static CopyFn real = Real("memcpy");
  Count(n);
  return real(dst, src, n);
}

void* memmove(void* dst, const void* src, size_t n) {
  static CopyFn real = Real("memmove");
  Count(n);
  return real(dst, src, n);
}

void* __memcpy_chk(void* dst, const void* src, size_t n, size_t) { return memcpy(dst, src, n); }

void* __memmove_chk(void* dst, const void* src, size_t n, size_t) { return memmove(dst, src, n); }

// dgmm-server ends with std::_Exit after its drain (service/server.h says
// why), which runs no static destructors: report here too.
[[noreturn]] void _Exit(int status) {
  report.Write();
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

}  // extern "C"
