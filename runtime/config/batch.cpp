#include "runtime/config/batch.hpp"

#include <optional>
#include <string>

#include "runtime/config/limits.hpp"
#include "runtime/config/text.hpp"

namespace zero::config::detail {

namespace {

constexpr const char* kTb = "train_batch_size";
constexpr const char* kMicro = "train_micro_batch_size_per_gpu";
constexpr const char* kAccum = "gradient_accumulation_steps";

void error(std::vector<Diagnostic>& d, std::string path, std::string message) {
  d.push_back({Diagnostic::Severity::error, std::move(path), std::move(message)});
}

std::string str(long long v) { return std::to_string(v); }

// "<tb> != <micro> x <accum> x <world> ..." with the derived one shown as the exact quotient, so
// the user sees why no whole number fits.
std::string derived(long long num, long long den) {
  return format_number(static_cast<double>(num) / static_cast<double>(den)) +
         " (derived; must be a whole number >= 1)";
}

}  // namespace

void resolve_batch(const BatchInput& in, const Environment& env, const DataParallel& dp,
                   Batch& out, std::vector<Diagnostic>& diagnostics) {
  using State = BatchKey::State;
  const long long w = dp.size;
  if (w < 1) return;  // reported by parse_config (world size) or the grid
  // "data-parallel world size 2 (4 ranks / 2 pipeline stages)": the size and where it comes from.
  const std::string ws = str(w) + dp.note;
  if (in.train_batch_size.state == State::invalid ||
      in.train_micro_batch_size_per_gpu.state == State::invalid ||
      in.gradient_accumulation_steps.state == State::invalid)
    return;  // the bad key is reported; the rule would only add noise

  bool any_auto = false;
  bool flags_ok = true;
  // A flag fills an absent or "auto" key; against an explicit value it must agree.
  auto take = [&](const BatchKey& k, const std::optional<long long>& flag, const char* name,
                  const char* flag_name) -> std::optional<long long> {
    if (flag && (*flag < 1 || *flag > kMaxBatch)) {
      error(diagnostics, "", std::string(flag_name) + " " + str(*flag) +
                                 ": expected an integer in 1.." + str(kMaxBatch));
      flags_ok = false;
      return std::nullopt;
    }
    if (k.state == State::value) {
      if (flag && *flag != k.value) {
        error(diagnostics, name,
              "the file says " + str(k.value) + " but " + flag_name + " says " + str(*flag) +
                  "; remove one of them (or set the key to \"auto\" to take the flag)");
        flags_ok = false;
      }
      return k.value;
    }
    if (k.state == State::auto_value) any_auto = true;
    if (flag) return *flag;
    return std::nullopt;
  };
  std::optional<long long> tb = take(in.train_batch_size, std::nullopt, kTb, "");
  std::optional<long long> mb =
      take(in.train_micro_batch_size_per_gpu, env.micro_batch_flag, kMicro, "--micro-batch");
  std::optional<long long> ga =
      take(in.gradient_accumulation_steps, env.grad_accum_flag, kAccum, "--grad-accum");
  if (!flags_ok) return;

  if (!tb && !mb) {
    if (!any_auto) {
      error(diagnostics, kTb,
            std::string("missing: give train_batch_size or train_micro_batch_size_per_gpu") +
                (ga ? " (gradient_accumulation_steps alone does not fix the batch size)" : "") +
                "; DeepSpeed needs one of them too");
      return;
    }
    mb = 1;  // "auto" with nothing to derive it from: micro-batch 1 (accumulation 1 below)
  }

  // Each key is at most kMaxBatch (read_batch_key) and so is the world size: a product of two
  // fits in 64 bits; micro x accumulation x world is checked against kMaxBatch before use.
  long long full = 0;
  auto fits = [&](long long m, long long g) {
    if (!__builtin_mul_overflow(m, g, &full) && !__builtin_mul_overflow(full, w, &full) &&
        full <= kMaxBatch)
      return true;
    error(diagnostics, kTb,
          "train_micro_batch_size_per_gpu " + str(m) + " x gradient_accumulation_steps " + str(g) +
              " x data-parallel world size " + ws + " = " +
              format_number(static_cast<double>(m) * static_cast<double>(g) *
                            static_cast<double>(w)) +
              " samples per step, more than zero-train counts (" + str(kMaxBatch) +
              "); use a smaller micro-batch or accumulation");
    return false;
  };
  const long long mw = mb ? *mb * w : 0, gw = ga ? *ga * w : 0;

  if (tb && mb && ga) {
    if (!fits(*mb, *ga)) return;
    if (full != *tb) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " + str(*mb) +
                " x gradient_accumulation_steps " + str(*ga) + " x data-parallel world size " +
                ws + " (= " + str(full) +
                "); fix one of them or remove train_batch_size to let it be derived");
      return;
    }
  } else if (tb && mb) {
    if (*tb % mw != 0) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " + str(*mb) +
                " x gradient_accumulation_steps " + derived(*tb, mw) +
                " x data-parallel world size " + ws + "; make train_batch_size a multiple of " +
                str(mw) + " (micro-batch x world size) or remove it to let it be derived");
      return;
    }
    ga = *tb / mw;
  } else if (tb && ga) {
    if (*tb % gw != 0) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " +
                derived(*tb, gw) + " x gradient_accumulation_steps " + str(*ga) +
                " x data-parallel world size " + ws + "; make train_batch_size a multiple of " +
                str(gw) + " (accumulation x world size) or give train_micro_batch_size_per_gpu");
      return;
    }
    mb = *tb / gw;
  } else if (tb) {
    ga = 1;
    if (*tb % w != 0) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " +
                derived(*tb, w) + " x gradient_accumulation_steps 1 (the default) x " +
                "data-parallel world size " + ws + "; make train_batch_size a multiple of " +
                str(w) + (dp.note.empty() ? " (the world size)" : " (the data-parallel size)") +
                " or give train_micro_batch_size_per_gpu instead");
      return;
    }
    mb = *tb / w;
  } else {  // micro-batch known, with or without accumulation
    if (!ga) ga = 1;
    if (!fits(*mb, *ga)) return;
    tb = full;
  }
  out.train_batch_size = *tb;
  out.train_micro_batch_size_per_gpu = *mb;
  out.gradient_accumulation_steps = *ga;
}

}  // namespace zero::config::detail
