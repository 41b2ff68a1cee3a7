// The memory ledger: current and peak bytes by category and space, capacity, the table.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "core/ledger.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::MemCategory;
using zero::MemSpace;

TEST_CASE("ledger: current and peak by category; total peak is the peak of the sum") {
  zero::MemoryLedger l("test", zero::kUnlimited, zero::kUnlimited);
  REQUIRE(l.try_reserve(MemSpace::device, MemCategory::parameters, 100));
  REQUIRE(l.try_reserve(MemSpace::device, MemCategory::gradients, 50));
  l.release(MemSpace::device, MemCategory::gradients, 50);
  REQUIRE(l.try_reserve(MemSpace::device, MemCategory::activations, 30));
  auto s = l.snapshot();
  CHECK(s.at(MemSpace::device, MemCategory::parameters).current == 100);
  CHECK(s.at(MemSpace::device, MemCategory::gradients).current == 0);
  CHECK(s.at(MemSpace::device, MemCategory::gradients).peak == 50);
  CHECK(s.total[0].current == 130);
  CHECK(s.total[0].peak == 150);  // 100 + 50 at once; not 100 + 50 + 30
  CHECK(s.total[1].current == 0);
  l.reset_peaks();
  CHECK(l.snapshot().at(MemSpace::device, MemCategory::gradients).peak == 0);
  CHECK(l.snapshot().total[0].peak == 130);
}

TEST_CASE("ledger: capacity is per space and refuses without changing anything") {
  zero::MemoryLedger l("test", 1000, 10);
  REQUIRE(l.try_reserve(MemSpace::device, MemCategory::parameters, 900));
  CHECK_FALSE(l.try_reserve(MemSpace::device, MemCategory::optimizer_states, 101));
  CHECK(l.try_reserve(MemSpace::device, MemCategory::optimizer_states, 100));  // exactly full
  CHECK_FALSE(l.try_reserve(MemSpace::device, MemCategory::other, 1));
  CHECK(l.current(MemSpace::device) == 1000);
  CHECK(l.try_reserve(MemSpace::host, MemCategory::master_weights, 10));
  CHECK_FALSE(l.try_reserve(MemSpace::host, MemCategory::master_weights, 1));
  // A request larger than the capacity itself must not overflow the comparison.
  zero::MemoryLedger big("test", 1000, 1000);
  CHECK_FALSE(big.try_reserve(MemSpace::device, MemCategory::other, zero::kUnlimited));
}

TEST_CASE("ledger: a shared capacity bounds device and host together") {
  // The cpu backend: device and host memory are one RAM, each space alone may use all of it.
  zero::MemoryLedger l("cpu:0", zero::kUnlimited, zero::kUnlimited, 1000);
  CHECK(l.shared_capacity() == 1000);
  REQUIRE(l.try_reserve(MemSpace::device, MemCategory::parameters, 700));
  CHECK_FALSE(l.try_reserve(MemSpace::host, MemCategory::optimizer_states, 301));
  CHECK(l.current(MemSpace::host) == 0);  // refused without a trace
  CHECK(l.try_reserve(MemSpace::host, MemCategory::optimizer_states, 300));  // exactly full
  CHECK_FALSE(l.try_reserve(MemSpace::device, MemCategory::other, 1));
  l.release(MemSpace::device, MemCategory::parameters, 700);
  CHECK(l.try_reserve(MemSpace::device, MemCategory::other, 700));
  CHECK_FALSE(l.try_reserve(MemSpace::host, MemCategory::other, zero::kUnlimited));
  // Each space's own capacity still applies inside the shared one.
  zero::MemoryLedger both("cpu:0", 100, zero::kUnlimited, 1000);
  CHECK_FALSE(both.try_reserve(MemSpace::device, MemCategory::other, 101));
  CHECK(both.try_reserve(MemSpace::host, MemCategory::other, 900));
  // The table says so.
  const std::string t = l.snapshot().table();
  CHECK_THAT(t, ContainsSubstring("shared capacity"));
  CHECK_THAT(t, ContainsSubstring("1000 B for device and host together (in use 1000 B)"));
  CHECK_THAT(zero::MemoryLedger("x", 1, 1).snapshot().table(), !ContainsSubstring("shared"));
}

TEST_CASE("ledger: releasing more than was allocated is an error") {
  zero::MemoryLedger l("test", zero::kUnlimited, zero::kUnlimited);
  REQUIRE(l.try_reserve(MemSpace::host, MemCategory::pinned_host, 10));
  CHECK_THROWS_AS(l.release(MemSpace::host, MemCategory::pinned_host, 11), zero::Error);
  CHECK_THROWS_AS(l.release(MemSpace::device, MemCategory::pinned_host, 1), zero::Error);
}

TEST_CASE("ledger: concurrent reservations are all counted") {
  zero::MemoryLedger l("test", zero::kUnlimited, zero::kUnlimited);
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};  // Catch2 assertions are not thread-safe: count, check after
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        if (!l.try_reserve(MemSpace::device, MemCategory::comm_buffers, 3)) ++refused;
        if (i % 2) l.release(MemSpace::device, MemCategory::comm_buffers, 3);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(refused == 0);
  CHECK(l.current(MemSpace::device, MemCategory::comm_buffers) == 4u * 5000u * 3u);
}

TEST_CASE("ledger: the table lists every category, both spaces and the capacity") {
  zero::MemoryLedger l("cpu:0", 8ull << 30, zero::kUnlimited);
  REQUIRE(l.try_reserve(MemSpace::device, MemCategory::master_weights, 3ull << 20));
  REQUIRE(l.try_reserve(MemSpace::host, MemCategory::optimizer_states, 1536));
  const std::string t = l.snapshot().table();
  for (const char* c : {"parameters", "gradients", "master weights", "optimizer states",
                        "activations", "communication buffers", "pinned host", "other", "total",
                        "capacity", "device now", "device peak", "host now", "host peak"})
    CHECK_THAT(t, ContainsSubstring(c));
  CHECK_THAT(t, ContainsSubstring("memory ledger of cpu:0"));
  CHECK_THAT(t, ContainsSubstring("3.00 MiB"));
  CHECK_THAT(t, ContainsSubstring("1.50 KiB"));
  CHECK_THAT(t, ContainsSubstring("8.00 GiB"));
  CHECK_THAT(t, ContainsSubstring("unlimited"));
}

TEST_CASE("ledger: the nvme space: its own columns once used, outside the shared capacity") {
  zero::MemoryLedger l("cpu:0", zero::kUnlimited, zero::kUnlimited, 1000);
  CHECK_THAT(l.snapshot().table(), !ContainsSubstring("nvme"));  // never used: the old table
  REQUIRE(l.try_reserve(MemSpace::host, MemCategory::gradients, 900));
  // The drive is not RAM: 5 MiB of swap files fit although device + host has 100 bytes left.
  REQUIRE(l.try_reserve(MemSpace::nvme, MemCategory::optimizer_states, 5ull << 20));
  REQUIRE(l.try_reserve(MemSpace::nvme, MemCategory::master_weights, 2560));
  CHECK_FALSE(l.try_reserve(MemSpace::host, MemCategory::gradients, 101));  // the shared bound holds
  CHECK(l.current(MemSpace::nvme) == (5ull << 20) + 2560);
  const std::string t = l.snapshot().table();
  CHECK_THAT(t, ContainsSubstring("nvme now"));
  CHECK_THAT(t, ContainsSubstring("nvme peak"));
  CHECK_THAT(t, ContainsSubstring("5.00 MiB"));
  CHECK_THAT(t, ContainsSubstring("2.50 KiB"));
  CHECK(zero::to_string(MemSpace::nvme) == "nvme");
  l.release(MemSpace::nvme, MemCategory::optimizer_states, 5ull << 20);
  CHECK(l.snapshot().at(MemSpace::nvme, MemCategory::optimizer_states).peak == 5ull << 20);
}

TEST_CASE("ledger: format_bytes") {
  CHECK(zero::format_bytes(0) == "0 B");
  CHECK(zero::format_bytes(1023) == "1023 B");
  CHECK(zero::format_bytes(1024) == "1.00 KiB");
  CHECK(zero::format_bytes(5ull << 40) == "5.00 TiB");
  CHECK(zero::format_bytes(zero::kUnlimited) == "unlimited");
}

TEST_CASE("ledger: parse_byte_size: integers, decimal and binary units") {
  CHECK(zero::parse_byte_size("0") == 0);
  CHECK(zero::parse_byte_size("4096") == 4096);
  CHECK(zero::parse_byte_size("1e9") == 1'000'000'000);
  CHECK(zero::parse_byte_size("24GiB") == 24LL * 1024 * 1024 * 1024);
  CHECK(zero::parse_byte_size("512MiB") == 512LL * 1024 * 1024);
  CHECK(zero::parse_byte_size("1.5GB") == 1'500'000'000);
  CHECK(zero::parse_byte_size("0.3MB") == 300'000);  // 0.3 is inexact in binary: rounds to the byte
  CHECK(zero::parse_byte_size("2 kib") == 2048);
  CHECK(zero::parse_byte_size(" 8TB ") == 8'000'000'000'000LL);
  CHECK(zero::parse_byte_size("100B") == 100);
  CHECK_FALSE(zero::parse_byte_size("").has_value());
  CHECK_FALSE(zero::parse_byte_size("GiB").has_value());
  CHECK_FALSE(zero::parse_byte_size("-1GiB").has_value());
  CHECK_FALSE(zero::parse_byte_size("1.5B").has_value());  // not a whole byte
  CHECK_FALSE(zero::parse_byte_size("24 parsecs").has_value());
  CHECK_FALSE(zero::parse_byte_size("10000000TiB").has_value());  // past a long long
}
