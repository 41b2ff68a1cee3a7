#include "core/phase.hpp"

#include <atomic>

namespace zero::phase {

namespace {
std::atomic<const char*> g_name{"start-up"};
std::atomic<long long> g_step{-1};
}  // namespace

void set(const char* name) noexcept { g_name.store(name ? name : "idle", std::memory_order_relaxed); }
void set_step(long long step) noexcept { g_step.store(step, std::memory_order_relaxed); }
const char* name() noexcept { return g_name.load(std::memory_order_relaxed); }
long long step() noexcept { return g_step.load(std::memory_order_relaxed); }

}  // namespace zero::phase
