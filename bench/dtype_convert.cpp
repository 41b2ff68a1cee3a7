// dtype_convert: bulk host conversion fp32 <-> bf16 / fp16 (core/dtype.hpp) against the
// host's memory bandwidth, measured in the same run.
//
// The conversion is memory-bound: per element it reads size(src) and writes size(dst) bytes.
// The reference is a memcpy of the same source buffer (which reads and writes 2 x size(src)
// bytes per element): its bytes/s turned into elements/s at the conversion's
// size(src) + size(dst) bytes per element is the limit a single-threaded conversion can reach.
// Single-threaded on purpose: the offload engine converts per bucket on its own threads.
//
//   build/bench/dtype_convert [--quick]
#include <cstring>
#include <vector>

#include "bench/common/report.hpp"
#include "core/dtype.hpp"

namespace {

const char* const kUsage =
    "usage: dtype_convert [--quick]\n"
    "  Host fp32<->bf16/fp16 conversion throughput vs memcpy bandwidth; JSON on stdout.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace zero::bench;
  const Options opt = parse_options(argc, argv, kUsage);
  // 64M elements: a 256 MiB fp32 buffer, well above the development machine's shared L3.
  const size_t n = opt.quick ? (64u << 20) : (128u << 20);
  const int reps = opt.quick ? 5 : 9;
  Report report("dtype_convert", argc, argv, opt.quick, 1, 1);

  std::vector<float> f32(n);
  std::vector<uint16_t> h16(n);
  std::vector<float> f32_out(n);
  for (size_t i = 0; i < n; ++i) f32[i] = static_cast<float>(i % 1000003) * 1e-3f - 500.0f;
  // Touch every destination page before timing so page faults are not measured.
  std::memset(h16.data(), 0, n * 2);
  std::memset(f32_out.data(), 0, n * 4);

  const Stats copy_s = time_it(1, reps, [&] { std::memcpy(f32_out.data(), f32.data(), n * 4); });
  const double bytes_per_s = 2.0 * 4.0 * static_cast<double>(n) / copy_s.median;

  struct Case {
    const char* name;
    zero::DType src, dst;
    const void* in;
    void* out;
  };
  const Case cases[] = {
      {"fp32 -> bf16", zero::DType::f32, zero::DType::bf16, f32.data(), h16.data()},
      {"bf16 -> fp32", zero::DType::bf16, zero::DType::f32, h16.data(), f32_out.data()},
      {"fp32 -> fp16", zero::DType::f32, zero::DType::f16, f32.data(), h16.data()},
      {"fp16 -> fp32", zero::DType::f16, zero::DType::f32, h16.data(), f32_out.data()},
  };
  for (const Case& c : cases) {
    const Stats s = time_it(1, reps, [&] { zero::convert(c.in, c.src, c.out, c.dst, n); });
    const double elem_bytes = static_cast<double>(zero::size_of(c.src) + zero::size_of(c.dst));
    Result r;
    r.name = std::string(c.name) + ", " + std::to_string(n >> 20) + "M elements, 1 thread";
    r.params = {{"n", n}, {"threads", 1}, {"src", zero::to_string(c.src)},
                {"dst", zero::to_string(c.dst)}, {"bytes_per_element", elem_bytes}};
    r.metric = "throughput";
    r.unit = "elements/s";
    r.value = rate(static_cast<double>(n), s);
    r.reference_name = "memcpy bandwidth (same run) at " + std::to_string(int(elem_bytes)) +
                       " B/element";
    r.reference_median = bytes_per_s / elem_bytes;
    // Our own goal (no issue sets one): a conversion pass should cost no more than the bytes
    // it moves, within 25%.
    r.goal = Goal{"ratio_at_least", 0.75};
    report.add(std::move(r));
  }
  report.print();
  return 0;
}
