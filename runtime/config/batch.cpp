#include "runtime/config/batch.hpp"

#include <optional>
#include <string>

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

void resolve_batch(const BatchInput& in, const Environment& env, Batch& out,
                   std::vector<Diagnostic>& diagnostics) {
  using State = BatchKey::State;
  const long long w = env.world_size;
  if (w < 1) return;  // reported by parse_config
  if (in.train_batch_size.state == State::invalid ||
      in.train_micro_batch_size_per_gpu.state == State::invalid ||
      in.gradient_accumulation_steps.state == State::invalid)
    return;  // the bad key is reported; the rule would only add noise

  bool any_auto = false;
  bool flags_ok = true;
  // A flag fills an absent or "auto" key; against an explicit value it must agree.
  auto take = [&](const BatchKey& k, const std::optional<long long>& flag, const char* name,
                  const char* flag_name) -> std::optional<long long> {
    if (flag && *flag < 1) {
      error(diagnostics, "", std::string(flag_name) + " " + str(*flag) +
                                 ": expected an integer >= 1");
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

  // Products of user-given numbers: refuse what would overflow rather than wrap.
  long long mw = 0, gw = 0, full = 0;
  auto fits = [&](long long a, long long b, long long& r) {
    if (!__builtin_mul_overflow(a, b, &r)) return true;
    error(diagnostics, kTb,
          "the batch keys multiply to more than a 64-bit integer holds; use smaller values");
    return false;
  };

  if (tb && mb && ga) {
    if (!fits(*mb, *ga, full) || !fits(full, w, full)) return;
    if (full != *tb) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " + str(*mb) +
                " x gradient_accumulation_steps " + str(*ga) + " x data-parallel world size " +
                str(w) + " (= " + str(full) +
                "); fix one of them or remove train_batch_size to let it be derived");
      return;
    }
  } else if (tb && mb) {
    if (!fits(*mb, w, mw)) return;
    if (*tb % mw != 0) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " + str(*mb) +
                " x gradient_accumulation_steps " + derived(*tb, mw) +
                " x data-parallel world size " + str(w) + "; make train_batch_size a multiple of " +
                str(mw) + " (micro-batch x world size) or remove it to let it be derived");
      return;
    }
    ga = *tb / mw;
  } else if (tb && ga) {
    if (!fits(*ga, w, gw)) return;
    if (*tb % gw != 0) {
      error(diagnostics, kTb,
            "train_batch_size " + str(*tb) + " != train_micro_batch_size_per_gpu " +
                derived(*tb, gw) + " x gradient_accumulation_steps " + str(*ga) +
                " x data-parallel world size " + str(w) + "; make train_batch_size a multiple of " +
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
                "data-parallel world size " + str(w) + "; make train_batch_size a multiple of " +
                str(w) + " (the world size) or give train_micro_batch_size_per_gpu instead");
      return;
    }
    mb = *tb / w;
  } else {  // micro-batch known, with or without accumulation
    if (!ga) ga = 1;
    if (!fits(*mb, *ga, full) || !fits(full, w, full)) return;
    tb = full;
  }
  out.train_batch_size = *tb;
  out.train_micro_batch_size_per_gpu = *mb;
  out.gradient_accumulation_steps = *ga;
}

}  // namespace zero::config::detail
