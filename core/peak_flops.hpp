// Dense peak throughput of the GPUs we know, for MFU (model FLOPs utilisation): the model's
// FLOPs per second divided by this. Values are the vendors' dense (no structured sparsity)
// tensor-core figures for 16-bit inputs with fp32 accumulation, from their data sheets:
//   H100 SXM 989.4 TFLOP/s bf16/fp16; H100 PCIe 756.5; H100 NVL 835.5 (per GPU);
//   H200 (SXM) 989.4; A100 312; V100 (SXM2) 125 fp16 (no bf16); A10 125; L4 121; L40S 362.
// Matched on the device's name as the driver reports it ("NVIDIA H100 80GB HBM3"), most
// specific first. Unknown devices (and the cpu backend) give nullopt: no MFU is printed.
#pragma once

#include <optional>
#include <string_view>

namespace zero {

inline std::optional<double> peak_dense_16bit_flops(std::string_view device_name) noexcept {
  struct Entry {
    std::string_view match;
    double tflops;
  };
  static constexpr Entry kTable[] = {
      {"H100 PCIe", 756.5}, {"H100 NVL", 835.5}, {"H100", 989.4}, {"H200", 989.4},
      {"GH200", 989.4},     {"A100", 312.0},     {"V100", 125.0}, {"L40S", 362.0},
      {"A10", 125.0},       {"L4", 121.0},
  };
  if (device_name.find("cpu") == 0) return std::nullopt;
  for (const Entry& e : kTable)
    if (device_name.find(e.match) != std::string_view::npos) return e.tflops * 1e12;
  return std::nullopt;
}

}  // namespace zero
