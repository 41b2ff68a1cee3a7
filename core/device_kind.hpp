// The two backends. Kept in its own header so streams, devices and the config can name a backend
// without pulling in each other.
#pragma once

#include <optional>
#include <string_view>

namespace zero {

enum class DeviceKind { cpu, cuda };

constexpr std::string_view to_string(DeviceKind k) noexcept {
  return k == DeviceKind::cpu ? "cpu" : "cuda";
}

inline std::optional<DeviceKind> parse_device_kind(std::string_view s) noexcept {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "cuda" || s == "gpu") return DeviceKind::cuda;
  return std::nullopt;
}

}  // namespace zero
