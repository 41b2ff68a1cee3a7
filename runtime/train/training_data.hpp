// The data of a zero-train run: the embedded addition task (the default) or llm.c token shards
// (--data), and the held-out set its evaluations read (docs/training.md).
//
// A Data is built once at start-up on every rank (open_data) and read-only afterwards; the
// held-out set it hands out reads through it, so the Data must stay where it is (not moved)
// while that set is in use.
#pragma once

#include <memory>
#include <string>

#include "models/data/addition_task.hpp"
#include "models/data/dataset.hpp"
#include "models/data/token_shards.hpp"
#include "models/gpt.hpp"
#include "runtime/config/config.hpp"
#include "runtime/train/flags.hpp"
#include "runtime/train/held_out_eval.hpp"

namespace zero::train {

// The batches of a run: the addition task or token shards, and their held-out counterparts.
// With --eval-only and --eval-data alone there is no training data.
struct Data {
  std::unique_ptr<models::data::AdditionTask> addition;
  std::unique_ptr<models::data::TokenShards> shards, eval_shards;
  int seq_len = 0;
  bool has_train() const { return addition || shards; }
  const models::data::Dataset& train() const {
    return shards ? static_cast<const models::data::Dataset&>(*shards) : *addition;
  }
  std::string describe() const {
    return has_train() ? train().describe() : "held-out only: " + eval_shards->describe();
  }
  bool has_eval() const { return addition || eval_shards; }
  // The fixed, ordered held-out set (docs/training.md): the addition task's held-out problems
  // in the split's order, or the --eval-data windows in file order. Reads through this Data.
  HeldOutSet held_out() const;
};

// The default data (the embedded addition task) as the run configures it.
models::data::AdditionOptions addition_options(const config::Config& c);

// The addition task's needs of the model: a clear error naming the model's sizes. Throws
// zero::Error.
void check_model_fits_addition(const models::data::AdditionTask& task, const models::GptShape& shape);

// The flag the data comes from, for error messages: "--data PATTERN", "--eval-data PATTERN" or
// "data" (the addition task).
std::string data_source(const Flags& flags);

// Fills `data` as the flags ask (--data, --eval-data, else the addition task) for the config's
// model and seed, checking that every shard is long enough for one sequence. Reads files on this
// rank only; throws zero::Error naming the file and the problem.
void open_data(Data& data, const Flags& flags, const config::Config& c);

}  // namespace zero::train
