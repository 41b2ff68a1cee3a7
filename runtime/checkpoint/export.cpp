// Between checkpoints and safetensors files: export one state array of a checkpoint as whole
// fp32 tensors, import whole parameters from a file.
#include <cstdio>
#include <cstring>
#include <string_view>
#include <cmath>
#include <unordered_map>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace zero::checkpoint {

void export_safetensors(const std::string& dir, const std::string& tag, const std::string& array,
                        const std::string& out_path) {
  const Info info = read_info(dir, tag);
  // Every parameter whole, in table order: the slicing of a world of one.
  std::vector<Piece> pieces;
  std::vector<uint64_t> start;
  uint64_t total = 0;
  for (size_t p = 0; p < info.params.size(); ++p) {
    start.push_back(total);
    const int64_t n = info.params[p].numel();
    if (n > 0) pieces.push_back({static_cast<int>(p), 0, n});
    total += static_cast<uint64_t>(n);
  }
  std::vector<float> values(static_cast<size_t>(total));
  const Array arrays[] = {{array, values.data()}};
  load(dir, tag, {info.params, pieces, arrays});
  std::vector<TensorRef> tensors;
  for (size_t p = 0; p < info.params.size(); ++p)
    tensors.push_back({info.params[p].name, info.params[p].shape, values.data() + start[p]});
  write_safetensors(out_path, tensors, {{"zero_checkpoint", tag}, {"zero_array", array}});
}

namespace {

constexpr std::string_view kHfBodyPrefix = "transformer.";

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// "h.<digits>.attn.bias" or "h.<digits>.attn.masked_bias": the causal mask and the masking value
// that older Hugging Face GPT-2 checkpoints store as buffers (constants of the architecture,
// rebuilt by every loader, not weights).
bool is_hf_attention_buffer(std::string_view name) {
  if (!starts_with(name, "h.")) return false;
  size_t i = 2;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == 2) return false;
  const std::string_view rest = name.substr(i);
  return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

std::string float_text(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
  return b;
}

}  // namespace

std::vector<std::vector<float>> import_safetensors(const std::string& path,
                                                   std::span<const ParamInfo> params) {
  SafetensorsFile file = read_safetensors(path, {.keep_other_dtypes = true});
  // A tensor this reader could not convert is an error only when it is needed.
  auto require_widened = [&](const NamedTensor& t) {
    if (!t.widened)
      ZERO_FAIL("safetensors file " + io::quote(path) + ": tensor '" + t.name + "' has dtype \"" +
                t.dtype + "\"; parameters are read from F32, F16 or BF16 only\nHINT: convert the "
                "tensor to one of those (e.g. in PyTorch: .float()) and save the file again");
  };
  std::unordered_map<std::string, size_t> wanted;
  for (size_t p = 0; p < params.size(); ++p) wanted.emplace(params[p].name, p);

  // Each tensor's name as the model calls it. GPT2LMHeadModel.save_pretrained writes the body's
  // tensors as "transformer.<name>" (GPT2Model's files, and ours, have no prefix): the prefix is
  // dropped unless the model has a parameter of the full name.
  std::vector<std::string> key(file.tensors.size());
  std::unordered_map<std::string, size_t> by_key;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const std::string& name = file.tensors[i].name;
    key[i] = starts_with(name, kHfBodyPrefix) && !wanted.contains(name)
                 ? name.substr(kHfBodyPrefix.size())
                 : name;
    if (const auto [it, fresh] = by_key.emplace(key[i], i); !fresh)
      ZERO_FAIL("safetensors file " + io::quote(path) + " has both '" +
                file.tensors[it->second].name + "' and '" + name + "', one parameter '" + key[i] +
                "' twice (with and without Hugging Face's \"" + std::string(kHfBodyPrefix) +
                "\" prefix)\nHINT: keep one of the two in the file");
  }

  std::vector<std::vector<float>> out;
  std::vector<bool> used(file.tensors.size(), false);
  for (const ParamInfo& p : params) {
    const auto it = by_key.find(p.name);
    if (it == by_key.end())
      ZERO_FAIL("safetensors file " + io::quote(path) + " has no tensor '" + p.name +
                "' (nor '" + std::string(kHfBodyPrefix) + p.name +
                "'), a parameter of the model\nHINT: the file was written for another model "
                "(or with other parameter names); export it from a matching checkpoint");
    NamedTensor& t = file.tensors[it->second];
    require_widened(t);
    if (t.shape != p.shape) {
      std::string hint = "build the model with the sizes the file was written for";
      if (p.name == "wpe.weight" && t.shape.size() == 2)
        hint = "the file has " + std::to_string(t.shape[0]) +
               " positions (Hugging Face's n_positions): set zero_train.model.seq_len to it (and "
               "n_embd to " + std::to_string(t.shape[1]) + ")";
      else if (p.name == "wte.weight" && t.shape.size() == 2)
        hint = "the file has a vocabulary of " + std::to_string(t.shape[0]) + " and hidden size " +
               std::to_string(t.shape[1]) + ": set zero_train.model.vocab_size and n_embd to them";
      ZERO_FAIL("safetensors file " + io::quote(path) + ": tensor '" + t.name + "' has shape " +
                detail::shape_text(t.shape) + ", the model's parameter " +
                (t.name == p.name ? std::string() : "'" + p.name + "' ") + detail::shape_text(p.shape) + "\nHINT: " + hint);
    }
    if (const int64_t bad = first_non_finite(t.data); bad >= 0) {
      int64_t count = 0;
      for (float x : t.data) count += std::isfinite(x) ? 0 : 1;
      ZERO_FAIL("safetensors file " + io::quote(path) + ": tensor '" + p.name + "' holds " +
                std::to_string(count) + " non-finite value(s); the first is " +
                std::to_string(t.data[static_cast<size_t>(bad)]) + " at element " +
                std::to_string(bad) + " (row-major, shape " + detail::shape_text(t.shape) +
                ")\nHINT: weights that are NaN or infinite cannot be trained; the file comes "
                "from a run that diverged or was damaged: export it again from an earlier "
                "checkpoint, or start without --init-from");
    }
    used[it->second] = true;
    out.push_back(std::move(t.data));
  }

  // Tensors the model has no parameter for. A GPT ties its output head to the token embedding
  // (logits = x wte^T): a file's "lm_head.weight" is accepted when it is that same matrix (Hugging
  // Face writes it when saving without safetensors' deduplication), and refused when it differs,
  // since loading it would silently compute another model.
  std::string extra;
  size_t extras = 0, buffers = 0;
  for (size_t i = 0; i < used.size(); ++i) {
    if (used[i]) continue;
    const NamedTensor& t = file.tensors[i];
    const auto wte = wanted.find("wte.weight");
    if (key[i] == "lm_head.weight" && wte != wanted.end()) {
      const std::vector<float>& emb = out[wte->second];
      require_widened(t);
      if (t.shape != params[wte->second].shape)
        ZERO_FAIL("safetensors file " + io::quote(path) + ": '" + t.name + "' has shape " +
                  detail::shape_text(t.shape) + ", the token embedding 'wte.weight' " +
                  detail::shape_text(params[wte->second].shape) +
                  ": the file's output head is not tied to its embedding, and this GPT ties "
                  "them\nHINT: start from a model saved with tie_word_embeddings true");
      for (size_t e = 0; e < emb.size(); ++e)
        if (std::memcmp(&emb[e], &t.data[e], sizeof(float)) != 0)
          ZERO_FAIL("safetensors file " + io::quote(path) + ": '" + t.name +
                    "' differs from 'wte.weight' (first at element " + std::to_string(e) + ": " +
                    float_text(t.data[e]) + " vs " + float_text(emb[e]) +
                    "): the file's output head is not tied to its token embedding, and this GPT "
                    "ties them (its head is wte^T)\nHINT: start from a model saved with "
                    "tie_word_embeddings true; an untied head cannot be loaded into this model");
      log::info("import_safetensors " + io::quote(path) + ": '" + t.name +
                "' equals 'wte.weight' (the tied head), as this GPT has it");
      continue;
    }
    if (is_hf_attention_buffer(key[i])) {
      ++buffers;
      continue;
    }
    if (++extras <= 10) extra += (extra.empty() ? "'" : ", '") + t.name + "'";
  }
  if (buffers > 0)
    log::info("import_safetensors " + io::quote(path) + ": ignoring " + std::to_string(buffers) +
              " attention mask buffer(s) of Hugging Face's GPT-2 (h.<i>.attn.bias, "
              "h.<i>.attn.masked_bias): constants every loader rebuilds, not weights");
  if (extras > 0)
    log::warn("import_safetensors " + io::quote(path) + ": ignoring " + std::to_string(extras) +
              " tensor(s) the model does not have: " + extra + (extras > 10 ? ", ..." : ""));
  return out;
}

}  // namespace zero::checkpoint
