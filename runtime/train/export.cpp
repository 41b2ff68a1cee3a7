#include "runtime/train/export.hpp"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "models/gpt.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/hf_gpt2.hpp"
#include "runtime/train/exit_codes.hpp"
#include "runtime/train/rank_errors.hpp"

namespace zero::train {

int export_checkpoint(World& world, const Flags& flags) {
  if (!world.is_root()) return 0;  // one process writes the file
  try {
    std::string tag = flags.export_tag;
    if (tag.empty()) {
      const std::optional<checkpoint::Newest> n = checkpoint::find_newest(flags.export_dir);
      if (!n)
        ZERO_FAIL("no complete checkpoint in " + flags.export_dir +
                  "\nHINT: pass the --checkpoint-dir of a run that saved one, or --tag");
      if (!n->note.empty()) std::fprintf(stderr, "zero-train export: %s\n", n->note.c_str());
      tag = n->tag;
    }
    const checkpoint::Info info = checkpoint::read_info(flags.export_dir, tag);
    // The config.json is derived (and any problem with it reported) before a file is written.
    std::optional<models::GptShape> hf_shape;
    std::string hf_config_path;
    if (flags.export_hf_config) {
      long long n_head = checkpoint::recorded_n_head(info.metadata).value_or(0);
      if (flags.export_n_head) {
        if (n_head != 0 && n_head != *flags.export_n_head)
          ZERO_FAIL("--n-head " + std::to_string(*flags.export_n_head) + ", but the checkpoint was trained with " +
                    std::to_string(n_head) + " heads\nHINT: drop --n-head (the checkpoint's own number is used)");
        n_head = *flags.export_n_head;
      }
      if (n_head == 0)
        ZERO_FAIL("--hf-config: the checkpoint " + flags.export_dir + "/" + tag +
                  " does not record its number of attention heads (saved by an older zero-train)\n"
                  "HINT: pass --n-head N, the n_head of the model it was trained with");
      if (n_head > (1LL << 30)) ZERO_FAIL("--n-head " + std::to_string(n_head) + " is not a number of heads");
      hf_shape = checkpoint::gpt_shape_from_params(info.params, static_cast<int>(n_head));
      hf_config_path = (std::filesystem::path(flags.export_out).parent_path() / "config.json").string();
    }
    checkpoint::export_safetensors(flags.export_dir, tag, "master", flags.export_out);
    int64_t n = 0;
    for (const auto& p : info.params) n += p.numel();
    std::printf("zero-train export: %s/%s -> %s: %zu tensors, %lld parameters, fp32\n",
                flags.export_dir.c_str(), tag.c_str(), flags.export_out.c_str(), info.params.size(),
                static_cast<long long>(n));
    if (hf_shape) {
      checkpoint::write_hf_gpt2_config(hf_config_path, *hf_shape);
      std::printf("zero-train export: %s: Hugging Face GPT2LMHeadModel config (transformers' "
                  "from_pretrained loads the directory)\n", hf_config_path.c_str());
      if (std::filesystem::path(flags.export_out).filename() != "model.safetensors")
        std::printf("zero-train export: note: from_pretrained looks for model.safetensors in the "
                    "directory; rename %s to it\n", flags.export_out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-train export: error: %s\n", error_text(e).c_str());
    return kExitFailure;
  }
}

}  // namespace zero::train
