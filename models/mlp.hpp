// A small MLP, the second and fast workload: features [B, in] -> (Linear + GELU) x n_hidden ->
// Linear -> cross-entropy over `classes`. One Unit per layer ("fc.0", "fc.1", ..., "head"), so
// the engine's per-Unit paths (stage 3 gathers, bucketing, checkpointing) are exercised by a
// model that trains in milliseconds. Parameters "fc.{i}.weight" [in, out] (the GPT's Conv1D
// layout), "fc.{i}.bias" [out], "head.weight", "head.bias". Hidden Units are checkpointable.
//
// MlpTeacherTask gives it something learnable: features ~ N(0, 1) and a label that is the argmax
// of a fixed random two-layer "teacher" network of the features, all counter-based, so batch i
// is a pure function of (seed, i).
#pragma once

#include <cstdint>
#include <vector>

#include "models/ops.hpp"
#include "core/unit.hpp"

namespace zero::models {

struct MlpShape {
  int in_features = 16;
  int hidden = 64;
  int n_hidden = 2;   // Linear + GELU layers before the head (>= 1)
  int classes = 4;
};

struct MlpOptions {
  MlpShape shape;
  ScalarType param_type = ScalarType::f32;
  ScalarType activation_type = ScalarType::f32;  // the features' type too
};

// The Units read the batch's features (fp32/fp64 [B, in], of the activation type) and int32
// labels [B] (-1 ignored). The head sets ctx.loss and ctx.output (logits [B, classes]).
Model make_mlp(const MlpOptions& options, Ops& ops);

class MlpTeacherTask {
 public:
  MlpTeacherTask(MlpShape shape, uint64_t seed);
  // Samples first .. first+count-1: features [count * in_features] and labels [count].
  void batch(int64_t first, int count, std::vector<float>& features, std::vector<int32_t>& labels) const;

 private:
  MlpShape shape_;
  uint64_t seed_;
  int teacher_hidden_;
  std::vector<float> w1_, w2_;  // teacher weights [in, th], [th, classes]
};

}  // namespace zero::models
