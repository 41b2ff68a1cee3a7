// Hugging Face GPT-2 interoperability of an exported model (docs/checkpoint-format.md,
// "Hugging Face GPT-2"). An export already uses GPT-2's tensor names and Conv1D layout; what
// transformers' GPT2LMHeadModel.from_pretrained(DIR) further needs is DIR/config.json, which
// these functions derive from the checkpoint's parameter table. (Reading Hugging Face's own
// files, "transformer." prefix and tied lm_head included, is import_safetensors' job.)
//
// Pure functions of their arguments; thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "models/gpt_shape.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace zero::checkpoint {

// The shape of the GPT whose parameter table `params` is (models::make_gpt's names, shapes and
// order: wte [V, C], wpe [T, C], n_layer blocks h.<i>.*, ln_f), with `n_head` heads, which the
// table cannot tell. Throws zero::Error naming the first parameter that differs from such a
// GPT's, or an n_head that does not divide n_embd.
models::GptShape gpt_shape_from_params(std::span<const ParamInfo> params, int n_head);

// The number of attention heads zero-train recorded in a checkpoint's metadata
// ({"user": {"model": {"n_head": N, ...}}}), or nullopt (older checkpoints, other callers).
std::optional<int> recorded_n_head(std::string_view metadata);

// config.json for GPT2LMHeadModel with this shape and our model's arithmetic: pre-norm blocks,
// LayerNorm epsilon 1e-5, the tanh GELU ("gelu_new"), attention scaled by 1/sqrt(head size),
// no dropout, the head tied to wte; torch_dtype float32 (what export writes). JSON text, with a
// final newline.
std::string hf_gpt2_config_json(const models::GptShape& shape);

// Writes hf_gpt2_config_json(shape) to `path` atomically (a temporary file beside it, fsync,
// rename): an existing file is replaced whole or not at all. Throws naming the path.
void write_hf_gpt2_config(const std::string& path, const models::GptShape& shape);

}  // namespace zero::checkpoint
