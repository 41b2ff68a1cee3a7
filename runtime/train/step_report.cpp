#include "runtime/train/step_report.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "core/log.hpp"

namespace zero::train {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string metrics_line(nlohmann::json j) {
  nlohmann::json bad = nlohmann::json::object();
  const std::function<void(nlohmann::json&, const std::string&)> scan = [&](nlohmann::json& v, const std::string& key) {
    if (v.is_object()) {
      for (auto it = v.begin(); it != v.end(); ++it)
        scan(it.value(), key.empty() ? it.key() : key + "." + it.key());
    } else if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      const double x = v.get<double>();
      bad[key] = std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
      v = nullptr;
    }
  };
  scan(j, "");
  if (!bad.empty()) j["non_finite"] = std::move(bad);
  // The losses with every digit of their double (nlohmann prints the shortest text that reads
  // back as the same double, which is exact too, but %.17g is what earlier files hold).
  std::string text = j.dump();
  for (const char* name : {"loss", "eval_loss"}) {
    if (!j.contains(name) || !j[name].is_number_float()) continue;
    char exact[64];
    std::snprintf(exact, sizeof exact, "%.17g", j[name].get<double>());
    const std::string key = std::string("\"") + name + "\":";
    if (const size_t at = text.find(key); at != std::string::npos) {
      const size_t end = text.find_first_of(",}", at + key.size());
      text.replace(at + key.size(), end - at - key.size(), exact);
    }
  }
  return text;
}

std::string StepReport::metrics(long long step, double loss, const StepStats& st, double tokens, double dt_step,
                                const LedgerSnapshot& snap, const GridStep& grid) const {
  nlohmann::json j = {{"step", step},
                      {"loss", loss},
                      {"lr", st.lr},
                      {"grad_norm", st.grad_norm},
                      {"loss_scale", st.loss_scale},
                      {"applied", st.applied},
                      {"tokens_per_s", tokens / dt_step},
                      {"model_flops_per_s", tokens * flops_per_token / dt_step},
                      {"mfu", peak ? nlohmann::json(tokens * flops_per_token / dt_step / *peak) : nlohmann::json()},
                      {"step_time_s", dt_step},
                      {"device_bytes", snap.total[0].current},
                      {"host_bytes", snap.total[1].current},
                      {"device_peak_bytes", snap.total[0].peak},
                      {"host_peak_bytes", snap.total[1].peak}};
  if (grid.bubble) {
    j["bubble"] = grid.bubble->mean;
    j["bubble_max"] = grid.bubble->max;
  }
  if (grid.tensor_bytes) j["tensor_comm_bytes"] = *grid.tensor_bytes;
  if (grid.nvme) {
    j["nvme_read_bytes"] = grid.nvme->read;
    j["nvme_written_bytes"] = grid.nvme->written;
    j["nvme_bytes"] = snap.total[static_cast<int>(MemSpace::nvme)].current;
  }
  if (timers)
    j["time"] = {{"forward", st.time.forward},     {"backward", st.time.backward},
                 {"optimizer", st.time.optimizer}, {"comm_busy", st.time.comm_busy},
                 {"comm_exposed", st.time.comm_exposed}, {"d2h", st.time.d2h},
                 {"h2d", st.time.h2d},             {"host_adam", st.time.host_adam},
                 {"host_adam_waited", st.time.host_adam_waited}};
  return metrics_line(j);
}

void StepReport::print(long long step, long long steps, double loss, const StepStats& st, double tokens, double dt,
                       const LedgerSnapshot& snap, const GridStep& grid) const {
  // " (MFU x%)" where the peak is known, else nothing.
  auto mfu_text = [&](double flops_per_s) {
    if (!peak) return std::string();
    char b[32];
    std::snprintf(b, sizeof b, " (MFU %.1f%%)", 100.0 * flops_per_s / *peak);
    return std::string(b);
  };
  // " | bubble x% (mean over stages, max y%)" with pipeline stages.
  // " | tensor comm X per rank" with tensor slices.
  char bubble_text[160] = "";
  if (grid.bubble)
    std::snprintf(bubble_text, sizeof bubble_text, " | bubble %.1f%% (mean over stages, max %.1f%%)",
                  100.0 * grid.bubble->mean, 100.0 * grid.bubble->max);
  if (grid.tensor_bytes) {
    const size_t n = std::strlen(bubble_text);
    std::snprintf(bubble_text + n, sizeof bubble_text - n, " | tensor comm %s/rank",
                  format_bytes(static_cast<size_t>(*grid.tensor_bytes)).c_str());
  }
  // " | nvme N (read R, written W)" with the optimizer state on NVMe, after the host column.
  char nvme_text[160] = "";
  if (grid.nvme)
    std::snprintf(nvme_text, sizeof nvme_text, " | nvme %s (read %s, written %s)",
                  format_bytes(snap.total[static_cast<int>(MemSpace::nvme)].current).c_str(),
                  format_bytes(grid.nvme->read).c_str(), format_bytes(grid.nvme->written).c_str());
  char line[1024];
  std::snprintf(line, sizeof line,
                "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3g | loss scale %g%s | "
                "%.0f tokens/s | %.3g GFLOP/s%s | %.3f s/step%s | device %s | host %s%s",
                step, steps, loss, static_cast<double>(st.lr), static_cast<double>(st.grad_norm),
                st.loss_scale, st.applied ? "" : " (skipped: overflow)", tokens / dt,
                tokens * flops_per_token / dt * 1e-9, mfu_text(tokens * flops_per_token / dt).c_str(), dt,
                bubble_text, format_bytes(snap.total[0].current).c_str(), format_bytes(snap.total[1].current).c_str(),
                nvme_text);
  log::info(line);
  if (!timers) return;
  std::snprintf(line, sizeof line,
                "  time: forward %.3f s, backward %.3f s, optimizer %.3f s; communication "
                "busy %.3f s, exposed %.3f s",
                st.time.forward, st.time.backward, st.time.optimizer, st.time.comm_busy,
                st.time.comm_exposed);
  log::info(line);
  if (!offload_optimizer) return;
  std::snprintf(line, sizeof line,
                "  offload: host AdamW %.3f s (%.0f%% hidden%s), waits for copies down "
                "%.3f s, up %.3f s",
                st.time.host_adam, 100.0 * st.time.host_adam_hidden(),
                st.speculation == StepStats::Speculation::kept      ? ", ran during backward"
                : st.speculation == StepStats::Speculation::dropped ? ", guess dropped"
                                                                    : "",
                st.time.d2h, st.time.h2d);
  log::info(line);
}

void draw_progress_bar(long long step, long long steps, double loss) {
  const int width = 30, done = static_cast<int>(width * step / steps);
  std::printf("\r[%s%s] step %lld/%lld | loss %.4f ", std::string(static_cast<size_t>(done), '#').c_str(),
              std::string(static_cast<size_t>(width - done), '.').c_str(), step, steps, loss);
  std::fflush(stdout);
}

void clear_progress_bar() { std::printf("\r%*s\r", 80, ""); }

}  // namespace zero::train
