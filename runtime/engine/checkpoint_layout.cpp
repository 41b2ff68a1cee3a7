#include "runtime/engine/checkpoint_layout.hpp"

#include <algorithm>
#include <optional>

#include "core/error.hpp"

namespace zero::engine {
namespace {

// Every rank's text, in rank order. The collectives move floating-point types only, so each
// byte travels as one fp32 value (0-255, exact); a view's table is a few kilobytes.
std::vector<std::string> all_gather_text(coll::Communicator& comm, const std::string& mine) {
  const size_t n = static_cast<size_t>(comm.size());
  float len = static_cast<float>(mine.size());
  std::vector<float> lens(n);
  comm.all_gather(&len, lens.data(), 1, DType::f32).wait();
  size_t longest = 0;
  for (float l : lens) longest = std::max(longest, static_cast<size_t>(l));
  std::vector<float> send(longest, 0.0f), recv(longest * n);
  for (size_t i = 0; i < mine.size(); ++i) send[i] = static_cast<float>(static_cast<unsigned char>(mine[i]));
  comm.all_gather(send.data(), recv.data(), longest, DType::f32).wait();
  std::vector<std::string> out(n);
  for (size_t r = 0; r < n; ++r) {
    out[r].resize(static_cast<size_t>(lens[r]));
    for (size_t i = 0; i < out[r].size(); ++i)
      out[r][i] = static_cast<char>(static_cast<unsigned char>(recv[r * longest + i]));
  }
  return out;
}

}  // namespace

CheckpointLayout pipeline_layout(const Model& view, const PipelinePlace& place, int data_rank,
                                 int data_size, coll::Communicator& host_comm, const std::string& what) {
  ZERO_REQUIRE(place.to_original.size() == view.params.size(),
               what + ": the pipeline place maps " + std::to_string(place.to_original.size()) +
                   " parameters but the stage's model has " + std::to_string(view.params.size()));
  const int world = host_comm.size();
  ZERO_REQUIRE(host_comm.kind() == DeviceKind::cpu && world == data_size * place.stages,
               what + ": host_comm must be a cpu communicator over the whole grid (" +
                   std::to_string(place.stages) + " stages x " + std::to_string(data_size) +
                   " data-parallel ranks = " + std::to_string(data_size * place.stages) +
                   " ranks), it has " + std::to_string(world) +
                   "\nHINT: every rank of every stage calls it, with the world communicator");
  // Built from this rank's own data, so every rank agrees on the size check above before the
  // first collective (a mismatched host_comm fails on every rank alike: sizes are global).
  const std::vector<checkpoint::ParamInfo> mine = checkpoint::param_table(view);
  nlohmann::json me = {{"stage", place.stage}, {"data", data_rank}, {"units", view.units.size()}};
  nlohmann::json params = nlohmann::json::array();
  for (size_t i = 0; i < mine.size(); ++i)
    params.push_back({place.to_original[i], mine[i].name, mine[i].shape});
  me["params"] = std::move(params);
  const std::vector<std::string> texts = all_gather_text(host_comm, me.dump());

  // The union, checked identically on every rank.
  std::vector<std::optional<checkpoint::ParamInfo>> whole;
  std::vector<int> seen(static_cast<size_t>(data_size * place.stages), -1);
  std::vector<long long> units(static_cast<size_t>(place.stages), -1);
  for (size_t r = 0; r < texts.size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(texts[r]);
    const int st = j.at("stage").get<int>(), d = j.at("data").get<int>();
    ZERO_REQUIRE(st >= 0 && st < place.stages && d >= 0 && d < data_size,
                 what + ": rank " + std::to_string(r) + " of host_comm is stage " + std::to_string(st) +
                     ", data-parallel rank " + std::to_string(d) + ", outside the grid of " +
                     std::to_string(place.stages) + " x " + std::to_string(data_size));
    int& who = seen[static_cast<size_t>(st * data_size + d)];
    ZERO_REQUIRE(who < 0, what + ": ranks " + std::to_string(who) + " and " + std::to_string(r) +
                              " of host_comm are both stage " + std::to_string(st) +
                              ", data-parallel rank " + std::to_string(d) +
                              "\nHINT: pass the world communicator the grid was split from");
    who = static_cast<int>(r);
    units[static_cast<size_t>(st)] = j.at("units").get<long long>();
    for (const nlohmann::json& p : j.at("params")) {
      const int idx = p.at(0).get<int>();
      checkpoint::ParamInfo info{p.at(1).get<std::string>(), p.at(2).get<std::vector<int64_t>>()};
      if (static_cast<size_t>(idx) >= whole.size()) whole.resize(static_cast<size_t>(idx) + 1);
      std::optional<checkpoint::ParamInfo>& slot = whole[static_cast<size_t>(idx)];
      ZERO_REQUIRE(!slot || *slot == info,
                   what + ": the whole model's parameter " + std::to_string(idx) + " is " + slot->name +
                       " on one stage and " + info.name + " (or another shape) on stage " +
                       std::to_string(st) + "\nHINT: build every stage's view from the same model and cut");
      slot = std::move(info);
    }
  }
  CheckpointLayout out;
  for (size_t i = 0; i < whole.size(); ++i) {
    ZERO_REQUIRE(whole[i].has_value(),
                 what + ": the whole model's parameter " + std::to_string(i) +
                     " is used by no pipeline stage, so no stage holds it and it cannot be saved or "
                     "loaded\nHINT: remove the unused parameter from the model");
    out.table.push_back(std::move(*whole[i]));
  }
  nlohmann::json cut = nlohmann::json::array({0});
  long long at = 0;
  for (long long u : units) cut.push_back(at += u);
  out.info = {{"stages", place.stages}, {"data_parallel", data_size}, {"cut", std::move(cut)}};
  return out;
}

}  // namespace zero::engine
