// peak_flops.hpp: the MFU denominator, keyed by the driver's device name.
#include <catch2/catch_test_macros.hpp>

#include "core/peak_flops.hpp"

using zero::peak_dense_16bit_flops;

TEST_CASE("peak_flops: known GPUs by their driver names, most specific first") {
  CHECK(peak_dense_16bit_flops("cuda:0 (NVIDIA H100 80GB HBM3)") == 989.4e12);
  CHECK(peak_dense_16bit_flops("cuda:0 (NVIDIA H100 PCIe)") == 756.5e12);
  CHECK(peak_dense_16bit_flops("cuda:0 (NVIDIA H100 NVL)") == 835.5e12);
  CHECK(peak_dense_16bit_flops("cuda:0 (NVIDIA H200)") == 989.4e12);
  CHECK(peak_dense_16bit_flops("cuda:1 (NVIDIA A100-SXM4-80GB)") == 312e12);
  CHECK(peak_dense_16bit_flops("cuda:0 (Tesla V100-SXM2-32GB)") == 125e12);
  CHECK(peak_dense_16bit_flops("cuda:0 (NVIDIA L40S)") == 362e12);
  CHECK(peak_dense_16bit_flops("cuda:0 (NVIDIA L4)") == 121e12);
}

TEST_CASE("peak_flops: the cpu backend and unknown GPUs have no MFU") {
  CHECK_FALSE(peak_dense_16bit_flops("cpu:0").has_value());
  CHECK_FALSE(peak_dense_16bit_flops("cuda:0 (NVIDIA GeForce GTX 1080)").has_value());
}
