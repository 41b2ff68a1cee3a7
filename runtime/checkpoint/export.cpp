// Between checkpoints and safetensors files: export one state array of a checkpoint as whole
// fp32 tensors, import whole parameters from a file.
#include <cmath>
#include <unordered_map>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/log.hpp"

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

std::vector<std::vector<float>> import_safetensors(const std::string& path,
                                                   std::span<const ParamInfo> params) {
  SafetensorsFile file = read_safetensors(path);
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < file.tensors.size(); ++i) by_name.emplace(file.tensors[i].name, i);
  std::vector<std::vector<float>> out;
  std::vector<bool> used(file.tensors.size(), false);
  for (const ParamInfo& p : params) {
    const auto it = by_name.find(p.name);
    if (it == by_name.end())
      ZERO_FAIL("safetensors file " + io::quote(path) + " has no tensor '" + p.name +
                "', a parameter of the model\nHINT: the file was written for another model "
                "(or with other parameter names); export it from a matching checkpoint");
    NamedTensor& t = file.tensors[it->second];
    if (t.shape != p.shape)
      ZERO_FAIL("safetensors file " + io::quote(path) + ": tensor '" + p.name + "' has shape " +
                detail::shape_text(t.shape) + ", the model's parameter " +
                detail::shape_text(p.shape) +
                "\nHINT: build the model with the sizes the file was written for");
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
  std::string extra;
  size_t extras = 0;
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i] && ++extras <= 10)
      extra += (extra.empty() ? "'" : ", '") + file.tensors[i].name + "'";
  if (extras > 0)
    log::warn("import_safetensors " + io::quote(path) + ": ignoring " + std::to_string(extras) +
              " tensor(s) the model does not have: " + extra + (extras > 10 ? ", ..." : ""));
  return out;
}

}  // namespace zero::checkpoint
