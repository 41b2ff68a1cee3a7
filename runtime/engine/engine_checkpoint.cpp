// The engine's state in and out: checkpoints (save, load: runtime/checkpoint, re-sliced to this
// partition), set_parameters (an import), parameter() (a read). All between steps, collective.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/slice_pieces.hpp"
#include "runtime/engine/checkpoint_layout.hpp"
#include "runtime/engine/engine_state.hpp"

namespace zero {

std::vector<float> Engine::parameter(int p) {
  State& s = *s_;
  const Partition::Location& loc = s.x.part.location(p);
  // The step-end all-gather of a whole group writes its working buffer (this rank's range
  // included, in place): let it land first.
  s.params.wait_gather(loc.group);
  if (s.host) s.host->sync();
  s.x.compute.synchronize();  // AdamW of a device-resident shard runs on the compute stream
  std::vector<float> out(static_cast<size_t>(loc.numel), 0.0f);
  for (const Partition::Piece& pc : s.x.owned_pieces(loc.group)) {
    if (pc.param != p) continue;
    const size_t bytes = static_cast<size_t>(pc.count) * 4;
    if (s.opt->keeps(0)) {
      s.opt->read_state(loc.group, 0, pc.shard_offset, out.data() + pc.param_offset, pc.count);
    } else {  // fp32 without offload: the working parameters (device) are the master
      s.x.copy_now(out.data() + pc.param_offset, s.params.working(loc.group, pc.shard_offset), bytes);
    }
  }
  // Each element is owned by exactly one rank; the others hold 0 there, so the sum is the
  // value (a -0.0 reads back as +0.0). Stage 0: every rank owns everything already.
  if (s.x.o.stage != 0 && s.x.world > 1) {
    if (s.x.comm.kind() == DeviceKind::cpu) {
      s.x.comm.all_reduce(out.data(), out.data(), out.size(), DType::f32, coll::ReduceOp::sum).wait();
    } else {  // NCCL takes device buffers
      Tensor t = Tensor::empty(s.x.dev, Shape{static_cast<int64_t>(out.size())}, ScalarType::f32, MemCategory::other);
      s.x.copy_now(t.data(), out.data(), out.size() * 4);
      s.x.comm.all_reduce(t.data(), t.data(), out.size(), DType::f32, coll::ReduceOp::sum, s.x.compute_point()).wait();
      s.x.copy_now(out.data(), t.data(), out.size() * 4);
    }
  }
  return out;
}


namespace {

constexpr const char* kArrays[3] = {"master", "exp_avg", "exp_avg_sq"};

// Agrees on failure across ranks: every rank learns whether any failed and the highest failing
// rank. A rank that failed rethrows its own error; the others throw one naming that rank.
void agree(coll::Communicator& comm, const std::string& what, const std::string& error) {
  float failed = error.empty() ? -1.0f : static_cast<float>(comm.rank());
  comm.all_reduce(&failed, &failed, 1, DType::f32, coll::ReduceOp::max).wait();
  if (!error.empty()) ZERO_FAIL(error);
  if (failed >= 0)
    ZERO_FAIL(what + ": rank " + std::to_string(static_cast<int>(failed)) +
              " failed (its error is reported there); nothing was changed here");
}

// The parameter table a checkpoint of this engine is saved under and read against: the model's
// own, or in a pipeline the whole model's, assembled from every stage (collective over host_comm
// then). `info` gets the pipeline's layout for the manifest.
std::vector<checkpoint::ParamInfo> checkpoint_table(const Model& model, const engine::Context& x,
                                                    coll::Communicator& host_comm, const std::string& what,
                                                    nlohmann::json* info) {
  // With tensor slices the tensor ranks of a data index are more holders of the same (whole)
  // table: host_comm spans them too.
  const int T = x.tensor.active() ? x.tensor.comm->size() : 1;
  const int t = x.tensor.active() ? x.tensor.comm->rank() : 0;
  if (!x.place.active()) {
    ZERO_REQUIRE(host_comm.kind() == DeviceKind::cpu && host_comm.size() == x.world * T,
                 what + ": host_comm must be a cpu communicator over the engine's " +
                     std::to_string(x.world * T) + " ranks" +
                     (T > 1 ? " (" + std::to_string(x.world) + " data-parallel x " + std::to_string(T) +
                                  " tensor ranks: the world the grid was split from)"
                            : std::string()));
    if (info && T > 1) *info = {{"data_parallel", x.world}, {"tensor", T}};
    return checkpoint::param_table(model);
  }
  engine::CheckpointLayout l = engine::pipeline_layout(model, x.place, t * x.world + x.rank, x.world * T, host_comm, what);
  if (T > 1) {
    l.info["data_parallel"] = x.world;
    l.info["tensor"] = T;
  }
  if (info) *info = std::move(l.info);
  return std::move(l.table);
}

}  // namespace

void Engine::save_checkpoint(const std::string& dir, const std::string& tag,
                             coll::Communicator& host_comm, const std::string& user_metadata) {
  State& s = *s_;
  nlohmann::json layout;
  const std::vector<checkpoint::ParamInfo> table =
      checkpoint_table(s.x.model, s.x, host_comm, "save_checkpoint " + dir + "/" + tag, &layout);
  s.settle();

  const EnginePieces ep = s.checkpoint_pieces(true);
  std::vector<std::vector<float>> data(3, std::vector<float>(static_cast<size_t>(ep.total)));
  int64_t k = 0;
  for (const auto& [g, pc] : ep.where) {
    for (int a = 0; a < 3; ++a) {
      float* dst = data[static_cast<size_t>(a)].data() + k;
      const size_t bytes = static_cast<size_t>(pc.count) * 4;
      if (s.opt->keeps(a)) {
        s.opt->read_state(g, a, pc.shard_offset, dst, pc.count);
      } else {  // fp32 without offload: the working parameters (device) are the master
        s.x.copy_now(dst, s.params.working(g, pc.shard_offset), bytes);
      }
    }
    k += pc.count;
  }
  // A checkpoint holds only finite state: one saved after the run diverged would replace the
  // last good one as `latest` and could only resume into NaN. Refused on every rank, before
  // anything is written.
  std::string nonfinite;
  for (int a = 0; a < 3 && nonfinite.empty(); ++a) {
    const int64_t bad = checkpoint::first_non_finite(data[static_cast<size_t>(a)]);
    if (bad < 0) continue;
    const std::vector<checkpoint::Piece>& pieces = ep.pieces;
    int64_t start = 0;
    size_t p = 0;
    while (p + 1 < pieces.size() && start + pieces[p].length() <= bad) start += pieces[p++].length();
    // The element of the whole parameter (a strided piece's runs are `stride` apart).
    const checkpoint::Piece& pc = pieces[p];
    const int64_t in = bad - start;
    const int64_t element = pc.offset + (in / pc.count) * pc.stride + in % pc.count;
    nonfinite = "save_checkpoint " + dir + "/" + tag + ": the model state is not finite (" +
                kArrays[a] + " of parameter " + table[static_cast<size_t>(pc.param)].name +
                ", element " + std::to_string(element) +
                ", is " + std::to_string(data[static_cast<size_t>(a)][static_cast<size_t>(bad)]) +
                "): not saved, so the checkpoints already in " + dir + " stay as they are";
  }
  agree(host_comm, "save_checkpoint " + dir + "/" + tag, nonfinite);
  nlohmann::json meta;
  nlohmann::json engine = {{"steps", s.opt->steps},
                           {"applied_steps", s.opt->applied},
                           {"stage", s.x.o.stage},
                           {"world_size", s.x.world},
                           {"param_type", to_string(s.x.dtype)},
                           {"loss_scaler", nullptr}};
  // The layout is recorded for information (what saved it); loading never depends on it: the
  // pieces are the whole model's, in any slicing.
  if (s.x.place.active()) engine["pipeline"] = std::move(layout);
  else if (s.x.tensor.active()) engine["grid"] = std::move(layout);
  if (s.opt->scaler) {
    const optim::LossScalerState ls = s.opt->scaler->state();
    engine["loss_scaler"] = {{"scale", ls.scale},
                             {"cur_iter", ls.cur_iter},
                             {"last_overflow_iter", ls.last_overflow_iter},
                             {"cur_hysteresis", ls.cur_hysteresis},
                             {"skipped_steps", ls.skipped_steps}};
  }
  meta["engine"] = std::move(engine);
  std::string user_error;
  try {
    meta["user"] = nlohmann::json::parse(user_metadata);
  } catch (const std::exception& e) {
    user_error = std::string("save_checkpoint: user_metadata is not JSON: ") + e.what();
  }
  agree(host_comm, "save_checkpoint", user_error);
  const std::string text = meta.dump();

  const std::vector<checkpoint::ConstArray> arrays = {{kArrays[0], data[0].data()},
                                                      {kArrays[1], data[1].data()},
                                                      {kArrays[2], data[2].data()}};
  checkpoint::SaveRequest req;
  req.params = table;
  req.pieces = ep.pieces;
  req.arrays = arrays;
  req.metadata = text;
  checkpoint::save(dir, tag, host_comm, req);
}

uint64_t Engine::checkpoint_bytes() const {
  const State& s = *s_;
  const EnginePieces ep = s.checkpoint_pieces(true);
  const std::vector<checkpoint::ParamInfo> table = checkpoint::param_table(s.x.model);
  // Names only: save_bytes reads no data. The metadata is bounded by a generous stand-in (the
  // engine's counters, the loss scaler and a caller's few keys are a few hundred bytes).
  const std::vector<checkpoint::ConstArray> arrays = {{kArrays[0], nullptr}, {kArrays[1], nullptr},
                                                      {kArrays[2], nullptr}};
  const std::string metadata(4096, ' ');
  checkpoint::SaveRequest req;
  req.params = table;
  req.pieces = ep.pieces;
  req.arrays = arrays;
  req.metadata = metadata;
  const PipelinePlace& pl = s.x.place;
  const bool sliced = s.x.tensor.active();
  if (!pl.active() && !sliced) return checkpoint::save_bytes(req, s.x.rank);
  // A pipeline: the manifest (written by the world's rank 0, stage 0's data rank 0) lists the
  // whole model's table, which no stage holds; each stage's data rank 0 adds its view's part
  // of it (a tied parameter counted on each holding stage: a bound). With tensor slices, the
  // world's rank 0 is also tensor rank 0; the other tensor ranks count their view's part too (a
  // bound again: the table is the same for all of them).
  const bool world_root = (!pl.active() || pl.stage == 0) && s.x.rank == 0 &&
                          (!sliced || s.x.tensor.comm->rank() == 0);
  uint64_t bytes = checkpoint::save_bytes(req, world_root ? 0 : 1);
  if (!world_root && s.x.rank == 0) {
    checkpoint::SaveRequest names = req, none = req;
    names.pieces = {};
    none.pieces = {};
    none.params = {};
    bytes += checkpoint::save_bytes(names, 0) - checkpoint::save_bytes(none, 0);
  }
  return bytes;
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag,
                                    coll::Communicator& host_comm) {
  State& s = *s_;
  const std::vector<checkpoint::ParamInfo> table =
      checkpoint_table(s.x.model, s.x, host_comm, "load_checkpoint " + dir + "/" + tag, nullptr);
  const EnginePieces ep = s.checkpoint_pieces(false);
  std::vector<std::vector<float>> data(3, std::vector<float>(static_cast<size_t>(ep.total)));
  const std::vector<checkpoint::Array> arrays = {{kArrays[0], data[0].data()},
                                                 {kArrays[1], data[1].data()},
                                                 {kArrays[2], data[2].data()}};
  nlohmann::json meta;
  std::string error;
  int64_t steps = 0, applied = 0;
  std::optional<optim::LossScalerState> scaler_state;
  try {
    checkpoint::LoadRequest req;
    req.params = table;
    req.pieces = ep.pieces;
    req.arrays = arrays;
    req.require_finite = true;  // NaN weights or moments would only train NaN
    const checkpoint::LoadResult r = checkpoint::load(dir, tag, req);
    meta = nlohmann::json::parse(r.metadata);
    const nlohmann::json& e = meta.at("engine");
    steps = e.at("steps").get<int64_t>();
    applied = e.at("applied_steps").get<int64_t>();
    if (e.contains("loss_scaler") && e["loss_scaler"].is_object()) {
      const nlohmann::json& l = e["loss_scaler"];
      optim::LossScalerState ls;
      ls.scale = l.at("scale").get<double>();
      ls.cur_iter = l.at("cur_iter").get<int64_t>();
      ls.last_overflow_iter = l.at("last_overflow_iter").get<int64_t>();
      ls.cur_hysteresis = l.at("cur_hysteresis").get<int>();
      ls.skipped_steps = l.at("skipped_steps").get<int64_t>();
      scaler_state = ls;
    }
  } catch (const Error& e) {
    error = e.message();
  } catch (const std::exception& e) {
    error = "checkpoint " + dir + "/" + tag + ": its metadata has no engine counters (" + e.what() +
            "): it was not written by Engine::save_checkpoint";
  }
  agree(host_comm, "load_checkpoint " + dir + "/" + tag, error);

  s.install(ep, data[0].data(), data[1].data(), data[2].data());
  s.opt->steps = steps;
  s.opt->applied = applied;
  if (s.opt->scaler && scaler_state) s.opt->scaler->restore(*scaler_state);
  return meta.contains("user") ? meta["user"].dump() : "{}";
}

void Engine::State::settle() {
  params.wait_gathers();
  if (host) host->sync();
  x.compute.synchronize();
}

// Nothing may fail here but communication.
void Engine::State::install(const EnginePieces& ep, const float* master_vals, const float* m_vals,
                            const float* v_vals) {
  params.wait_gathers();
  if (host) host->sync();
  if (x.o.stage == 3) params.release_all();  // gathered copies of the old shards
  x.compute.synchronize();
  opt->state_replaced();
  int64_t k = 0;
  for (const auto& [g, pc] : ep.where) {
    const float* src[3] = {master_vals + k, m_vals ? m_vals + k : nullptr, v_vals ? v_vals + k : nullptr};
    for (int a = 0; a < 3; ++a)
      if (opt->keeps(a)) opt->write_state(g, a, pc.shard_offset, src[a], pc.count);  // null: zeros
    // The working copy: the master rounded to the parameter type, where this rank keeps it.
    x.upload_as(params.working(g, pc.shard_offset), x.dtype, master_vals + k, pc.count, params.shard_on_host(g));
    k += pc.count;
  }
  params.flush();  // shards on NVMe: the new values on the drive
  // Whole groups: every rank wrote its shard; gather them (stage 0: every rank wrote all).
  params.gather_whole_now();
  if (x.o.stage == 3) params.prefetch(0);
}

void Engine::set_parameters(const std::vector<std::vector<float>>& values) {
  State& s = *s_;
  // values is indexed by the whole model's parameters; in a pipeline this stage takes those of
  // its view (to_original), so every stage is handed the same vector (import_safetensors of the
  // whole model's table, as zero-train's --init-from does).
  const std::vector<int>& orig = s.x.place.to_original;
  const size_t model_params = s.x.model.params.size();
  if (!s.x.place.active()) {
    ZERO_REQUIRE(values.size() == model_params,
                 "set_parameters: " + std::to_string(values.size()) + " arrays for a model of " +
                     std::to_string(model_params) + " parameters");
  } else {
    const size_t need = orig.empty() ? 0 : static_cast<size_t>(*std::max_element(orig.begin(), orig.end())) + 1;
    ZERO_REQUIRE(values.size() >= need,
                 "set_parameters: " + std::to_string(values.size()) + " arrays, but pipeline stage " +
                     std::to_string(s.x.place.stage) + " holds the whole model's parameter " +
                     std::to_string(need - 1) + "\nHINT: pass every parameter of the whole model, "
                     "indexed as in the whole model's table, to every stage");
  }
  for (size_t p = 0; p < model_params; ++p) {
    const size_t at = s.x.place.active() ? static_cast<size_t>(orig[p]) : p;
    // A tensor rank's slice is handed the whole parameter and keeps its part.
    const ParamSpec& spec = s.x.model.params[p];
    const int64_t numel = spec.slice.split == TensorSplit::none ? spec.numel() : spec.slice.full.numel();
    ZERO_REQUIRE(static_cast<int64_t>(values[at].size()) == numel,
                 "set_parameters: parameter " + spec.name + " has " + std::to_string(numel) +
                     " elements, got " + std::to_string(values[at].size()));
  }
  const EnginePieces ep = s.checkpoint_pieces(false);
  std::vector<float> master(static_cast<size_t>(ep.total));
  int64_t k = 0;
  for (const auto& [g, pc] : ep.where) {  // this model's parameter and its own element offsets
    (void)g;
    const ParamSpec& spec = s.x.model.params[static_cast<size_t>(pc.param)];
    const std::vector<float>& whole =
        values[s.x.place.active() ? static_cast<size_t>(orig[static_cast<size_t>(pc.param)]) : static_cast<size_t>(pc.param)];
    if (spec.slice.split == TensorSplit::sliced) {
      for (int64_t i = 0; i < pc.count; ++i)
        master[static_cast<size_t>(k + i)] = whole[static_cast<size_t>(param_slice_element(spec, pc.param_offset + i))];
    } else {
      std::memcpy(master.data() + k, whole.data() + pc.param_offset, static_cast<size_t>(pc.count) * 4);
    }
    k += pc.count;
  }
  s.install(ep, master.data(), nullptr, nullptr);
}


EnginePieces Engine::State::checkpoint_pieces(bool saving) const {
  EnginePieces ep;
  if (saving && x.o.stage == 0 && x.rank != 0) return ep;
  const PipelinePlace& pl = x.place;
  const bool tensor_root = !x.tensor.active() || x.tensor.comm->rank() == 0;
  for (int g = 0; g < x.part.group_count(); ++g)
    for (const Partition::Piece& pc : x.owned_pieces(g)) {
      if (pc.count <= 0) continue;
      int param = pc.param;
      const ParamSlice& slice = x.model.params[static_cast<size_t>(param)].slice;
      // A parameter every tensor rank holds whole is saved once, by tensor rank 0; every rank
      // loads it. A slice is saved by its own rank.
      if (saving && !tensor_root && slice.split != TensorSplit::sliced) continue;
      if (pl.active()) {
        // A tied parameter is saved once, by the lowest stage holding it; every holder loads it.
        if (saving && !pl.owns_tied && std::find(pl.tied.begin(), pl.tied.end(), param) != pl.tied.end())
          continue;
        param = pl.to_original[static_cast<size_t>(param)];  // the whole model's index
      }
      // The elements as pieces of the whole parameter (a slice's are strided runs), in the
      // order of the shard's, so the arrays are the shard's values unchanged.
      for (const checkpoint::Piece& whole : checkpoint::whole_pieces(slice, param, pc.param_offset, pc.count))
        ep.pieces.push_back(whole);
      ep.where.emplace_back(g, pc);
      ep.total += pc.count;
    }
  return ep;
}

}  // namespace zero
