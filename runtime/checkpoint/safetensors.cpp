#include "runtime/checkpoint/safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <set>

#include "runtime/checkpoint/file_io.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace zero::checkpoint {

namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is read straight into memory");

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Elements of `shape`, or -1 when a dimension is negative or the product passes 2^62.
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 62)) return -1;
  return n;
}

// Bytes per element of the safetensors dtypes this reader does not convert (kept without data
// when asked to: masks and ids that files carry beside the weights); 0 for an unknown name.
size_t other_dtype_size(const std::string& dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  if (dtype == "U16" || dtype == "I16") return 2;
  if (dtype == "U32" || dtype == "I32") return 4;
  if (dtype == "U64" || dtype == "I64" || dtype == "F64") return 8;
  return 0;
}

[[noreturn]] void bad_write(const std::string& path, const std::string& what) {
  ZERO_FAIL("write_safetensors " + io::quote(path) + ": " + what);
}

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  ZERO_FAIL("safetensors file " + io::quote(path) + ": " + what +
            "\nHINT: the file is damaged, truncated or not a safetensors file; export it again");
}

}  // namespace

void write_safetensors(const std::string& path, std::span<const TensorRef> tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  Json meta = Json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  Json header = Json::object();
  header["__metadata__"] = std::move(meta);
  uint64_t offset = 0;
  std::set<std::string_view> names;
  for (const TensorRef& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      bad_write(path, "invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) bad_write(path, "tensor '" + t.name + "' appears twice");
    const int64_t n = numel_of(t.shape);
    if (n < 0)
      bad_write(path, "tensor '" + t.name + "' has an invalid shape " + shape_text(t.shape));
    if (n > 0 && t.data == nullptr) bad_write(path, "tensor '" + t.name + "' has no data");
    const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the reference writer aligns the buffer to 8
  const uint64_t n = text.size();
  std::string head(8, '\0');
  std::memcpy(head.data(), &n, 8);
  head += text;

  const auto write_to = [&](io::File& f) {
    f.write_all(head.data(), head.size());
    for (const TensorRef& t : tensors) {
      const uint64_t bytes = static_cast<uint64_t>(numel_of(t.shape)) * sizeof(float);
      if (bytes > 0) f.write_all(t.data, bytes);
    }
  };
  // A path that exists and is not a regular file (a pipe, /dev/stdout, a device, or a symlink
  // to one) is written in place: renaming a temporary file over it would replace the device
  // node or the pipe's name with a regular file and report success while the reader gets
  // nothing. There is nothing to fsync or rename; a failing write (/dev/full: ENOSPC) throws.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode))
      bad_write(path, "it is a directory\nHINT: give the file name to write, e.g. " + path +
                          "/model.safetensors");
    io::File f = io::File::create(path, "safetensors file");
    write_to(f);
    f.close();
    return;
  }

  // Atomic: a temporary file beside the target, flushed, then renamed over it.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  try {
    io::File f = io::File::create(tmp, "safetensors file",
                                  "check that the directory exists and is writable");
    write_to(f);
    f.sync();
    f.close();
    io::rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  io::fsync_dir(io::parent_dir(path));
}

SafetensorsFile read_safetensors(const std::string& path, const ReadOptions& options) {
  const io::File f = io::File::open_read(path, "safetensors file");
  const uint64_t size = f.size();
  if (size < 8)
    bad_file(path, "truncated: " + std::to_string(size) + " bytes, no 8-byte header length");
  uint64_t n = 0;
  f.pread_exact(&n, 8, 0, "the header length");
  if (n > kMaxHeaderBytes)
    bad_file(path, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                       std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    bad_file(path, "truncated: the header length says " + std::to_string(n) +
                       " bytes, the file has " + std::to_string(size - 8) + " after the length");
  std::string text(static_cast<size_t>(n), '\0');
  f.pread_exact(text.data(), text.size(), 8, "the header");
  if (text.empty() || text[0] != '{') bad_file(path, "the JSON header does not start with '{'");

  // Parsed with a callback that sees every top-level key: JSON objects may not repeat a key
  // here, and nlohmann would silently keep the last one.
  std::set<std::string> keys;
  std::string repeated;
  const auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second && repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, on_event);
  } catch (const Json::exception& e) {
    bad_file(path, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) bad_file(path, "the header is not a JSON object");
  if (!repeated.empty()) bad_file(path, "the header repeats the key '" + repeated + "'");

  SafetensorsFile out;
  const uint64_t buffer = size - 8 - n;
  struct Span {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad_file(path, "\"__metadata__\" is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          bad_file(path, "\"__metadata__\" value of '" + m.key() + "' is not a string");
        out.metadata.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor '" + name + "' ";
    if (!v.is_object()) bad_file(path, where + "is not a JSON object");
    const auto dt = v.find("dtype");
    const auto sh = v.find("shape");
    const auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) bad_file(path, where + "has no string \"dtype\"");
    if (sh == v.end() || !sh->is_array()) bad_file(path, where + "has no array \"shape\"");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      bad_file(path, where + "has no \"data_offsets\" [begin, end]");
    NamedTensor t;
    t.name = name;
    t.dtype = dt->get<std::string>();
    DType type = DType::f32;
    size_t element_bytes = 0;
    if (t.dtype == "F32")
      type = DType::f32;
    else if (t.dtype == "F16")
      type = DType::f16;
    else if (t.dtype == "BF16")
      type = DType::bf16;
    else if (options.keep_other_dtypes && (element_bytes = other_dtype_size(t.dtype)) > 0)
      t.widened = false;
    else
      ZERO_FAIL("safetensors file " + io::quote(path) + ": " + where + "has dtype \"" + t.dtype +
                "\"; this reader converts only F32, F16 and BF16 to fp32\nHINT: convert the "
                "tensor to one of those (e.g. in PyTorch: .float()) and save the file again");
    // The parser stores every non-negative integer as unsigned.
    for (const Json& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62))
        bad_file(path, where + "has an invalid shape " + sh->dump());
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    const int64_t numel = numel_of(t.shape);
    if (numel < 0) bad_file(path, where + "has a shape " + sh->dump() + " with too many elements");
    for (const Json& o : *off)
      if (!o.is_number_unsigned())
        bad_file(path, where + "has \"data_offsets\" " + off->dump() +
                           " that are not non-negative integers");
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end)
      bad_file(path,
               where + "has \"data_offsets\" " + off->dump() + " whose begin is past its end");
    const uint64_t bytes = static_cast<uint64_t>(numel) * (t.widened ? size_of(type) : element_bytes);
    if (end - begin != bytes)
      bad_file(path, where + "has \"data_offsets\" " + off->dump() + " spanning " +
                         std::to_string(end - begin) + " bytes, but shape " + shape_text(t.shape) +
                         " of " + t.dtype + " needs " + std::to_string(bytes));
    if (end > buffer)
      bad_file(path, where + "has \"data_offsets\" " + off->dump() + " past the end of the " +
                         std::to_string(buffer) + "-byte data buffer (truncated file?)");
    spans.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back(std::move(t));
  }

  // The tensors must fill the buffer exactly: sorted by offset, each starts where the last ended.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.begin < at)
      bad_file(path, "tensor '" + out.tensors[s.tensor].name + "' overlaps tensor '" +
                         out.tensors[spans[i - 1].tensor].name + "' in the data buffer");
    if (s.begin > at)
      bad_file(path, "bytes [" + std::to_string(at) + ", " + std::to_string(s.begin) +
                         ") of the data buffer belong to no tensor");
    at = s.end;
  }
  if (at != buffer)
    bad_file(path,
             std::to_string(buffer - at) + " bytes after the last tensor belong to no tensor");

  // The data, widened to fp32, in file order.
  std::vector<NamedTensor> ordered;
  std::vector<char> raw;
  const uint64_t base = 8 + n;
  for (const Span& s : spans) {
    NamedTensor& t = out.tensors[s.tensor];
    if (!t.widened) {  // kept by name, shape and dtype only
      ordered.push_back(std::move(t));
      continue;
    }
    const DType type = t.dtype == "F32" ? DType::f32 : t.dtype == "F16" ? DType::f16 : DType::bf16;
    const size_t count = static_cast<size_t>((s.end - s.begin) / size_of(type));
    t.data.resize(count);
    if (type == DType::f32) {
      f.pread_exact(t.data.data(), s.end - s.begin, base + s.begin, "tensor '" + t.name + "'");
    } else {
      raw.resize(static_cast<size_t>(s.end - s.begin));
      f.pread_exact(raw.data(), raw.size(), base + s.begin, "tensor '" + t.name + "'");
      convert(raw.data(), type, t.data.data(), DType::f32, count);
    }
    ordered.push_back(std::move(t));
  }
  out.tensors = std::move(ordered);
  return out;
}

}  // namespace zero::checkpoint
