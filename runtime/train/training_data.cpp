#include "runtime/train/training_data.hpp"

#include <cstdint>

#include "core/error.hpp"

namespace zero::train {

HeldOutSet Data::held_out() const {
  HeldOutSet set;
  if (addition) {
    set.size = addition->held_out_set_size(seq_len);
    set.read = [this](int64_t first, int count) { return addition->held_out_set_batch(first, count, seq_len); };
    set.exact_match = true;
  } else {
    set.size = eval_shards->windows_per_epoch(seq_len);
    set.read = [this](int64_t first, int count) { return eval_shards->ordered_batch(first, count, seq_len); };
  }
  return set;
}

models::data::AdditionOptions addition_options(const config::Config& c) {
  return {.digits = 2, .seed = static_cast<uint64_t>(c.seed), .held_out_fraction = 0.1};
}

void check_model_fits_addition(const models::data::AdditionTask& task, const models::GptShape& shape) {
  using models::data::AdditionTask;
  if (shape.vocab_size < AdditionTask::kVocabSize || shape.seq_len < task.min_seq_len())
    ZERO_FAIL("the addition task needs zero_train.model.vocab_size >= " +
              std::to_string(AdditionTask::kVocabSize) + " and seq_len >= " +
              std::to_string(task.min_seq_len()) + ", the model has " +
              std::to_string(shape.vocab_size) + " and " + std::to_string(shape.seq_len) +
              "\nHINT: use a larger vocabulary or context, or the preset \"tiny\"");
}

std::string data_source(const Flags& flags) {
  return !flags.data.empty()        ? "--data " + flags.data
         : !flags.eval_data.empty() ? "--eval-data " + flags.eval_data
                                    : std::string("data");
}

void open_data(Data& data, const Flags& flags, const config::Config& c) {
  const models::GptShape& shape = c.ours.model;
  if (flags.data.empty() && !flags.eval_data.empty()) {  // --eval-only on token shards
    data.seq_len = shape.seq_len;
    data.eval_shards = std::make_unique<models::data::TokenShards>(flags.eval_data, shape.vocab_size,
                                                                    static_cast<uint64_t>(c.seed) + 1);
    (void)data.eval_shards->windows_per_epoch(data.seq_len);
  } else if (flags.data.empty()) {
    data.addition = std::make_unique<models::data::AdditionTask>(addition_options(c));
    data.seq_len = data.addition->min_seq_len();
    check_model_fits_addition(*data.addition, shape);  // also in check_startup
  } else {
    data.seq_len = shape.seq_len;
    data.shards = std::make_unique<models::data::TokenShards>(flags.data, shape.vocab_size, static_cast<uint64_t>(c.seed));
    (void)data.shards->windows_per_epoch(data.seq_len);  // every shard long enough
    if (!flags.eval_data.empty()) {
      data.eval_shards = std::make_unique<models::data::TokenShards>(flags.eval_data, shape.vocab_size, static_cast<uint64_t>(c.seed) + 1);
      (void)data.eval_shards->windows_per_epoch(data.seq_len);
    }
  }
}

}  // namespace zero::train
