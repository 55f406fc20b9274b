#include "service/regions/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace dgmm {
namespace {

struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> poisoned{false};
  std::atomic<bool> used{false};
};

Slot g_slots[SigbusGuard::kMaxSlots];
std::atomic<long> g_absorbed{0};
struct sigaction g_previous;
std::once_flag g_installed;

void OnSigbus(int sig, siginfo_t* info, void* ucontext) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    const uintptr_t e = s.end.load(std::memory_order_acquire);
    if (b == 0 || addr < b || addr >= e) continue;
    // Replace the whole mapping by private zero pages, in place.
    void* p = mmap(reinterpret_cast<void*>(b), e - b, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    s.poisoned.store(true, std::memory_order_release);
    g_absorbed.fetch_add(1, std::memory_order_relaxed);
    return;  // the faulting access is retried and now succeeds
  }
  // Not ours: behave as if the guard were not there.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) {
      g_previous.sa_sigaction(sig, info, ucontext);
      return;
    }
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);  // the fault repeats on return and takes the default action
}

void Install() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

int SigbusGuard::Guard(void* begin, size_t bytes) {
  std::call_once(g_installed, Install);
  for (int i = 0; i < kMaxSlots; ++i) {
    bool expected = false;
    if (!g_slots[i].used.compare_exchange_strong(expected, true)) continue;
    const auto b = reinterpret_cast<uintptr_t>(begin);
    g_slots[i].poisoned.store(false);
    g_slots[i].end.store(b + bytes, std::memory_order_release);
    g_slots[i].begin.store(b, std::memory_order_release);
    return i;
  }
  return -1;
}

void SigbusGuard::Release(int slot) {
  if (slot < 0 || slot >= kMaxSlots) return;
  g_slots[slot].begin.store(0, std::memory_order_release);
  g_slots[slot].end.store(0, std::memory_order_release);
  g_slots[slot].used.store(false, std::memory_order_release);
}

bool SigbusGuard::poisoned(int slot) {
  return slot >= 0 && slot < kMaxSlots && g_slots[slot].poisoned.load(std::memory_order_acquire);
}

long SigbusGuard::absorbed() { return g_absorbed.load(); }

}  // namespace dgmm
