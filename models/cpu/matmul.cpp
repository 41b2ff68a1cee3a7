// Matrix products through oneDNN (contract in matmul.hpp).
//
// Threads. Debian's oneDNN runs on OpenMP: a primitive sizes its work split by
// omp_get_max_threads() of the thread that builds it and of the thread that runs it. Every thread
// that enters here sets its own OpenMP thread count to 1 (an OpenMP setting is per thread for
// threads OpenMP did not start, such as oneTBB's workers), so oneDNN never opens a parallel
// region: no OpenMP team is started, nothing spins beside oneTBB's workers on the shared cores,
// and a primitive's blocking (and so its summation order) never depends on a thread count.
// OMP_NUM_THREADS therefore has no effect on the cpu kernels.
//
// Scratch. Primitives are built in oneDNN's "user scratchpad" mode and each call passes a
// buffer owned by the calling thread: oneDNN's own scratchpad may be shared by every execution
// of a primitive, which would make concurrent calls of one cached primitive unsafe.
#include "models/cpu/matmul.hpp"

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "models/cpu/pack16.hpp"

namespace zero::models::cpu {
namespace {

using dnnl::memory;

[[noreturn]] void fail(const std::string& what, const dnnl::error& e, const char* statement,
                       int line) {
  detail::throw_error("oneDNN", what + ": " + e.what() + " (status " +
                                    std::to_string(static_cast<int>(e.status)) + ")",
                      statement, __FILE__, line);
}

memory::data_type dnnl_type(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return memory::data_type::f32;
    case ScalarType::bf16: return memory::data_type::bf16;
    case ScalarType::f16: return memory::data_type::f16;
    default: ZERO_FAIL("cpu matmul: operands of type " + std::string(to_string(t)) +
                       " (expected fp32, bf16 or fp16)");
  }
}

// Built on first use and never destroyed: cached primitives keep references into the engine,
// and oneDNN's own static state may already be gone when ours would be torn down at exit.
const dnnl::engine& cpu_engine() {
  static const auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// The file comment: one OpenMP thread for whatever oneDNN does on this thread. Checked on every
// call (reading the setting is cheap) because other code on the thread may have changed it.
void one_openmp_thread_here() {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
}

struct Key {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb, accumulate;
  ScalarType type;
  // 0: B as given (ldb, tb). Else B in oneDNN's preferred layout for products of pack_rows rows
  // (PackedWeight): the primitive for M == pack_rows chooses it, others take it as chosen.
  int64_t pack_rows = 0;
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  dnnl::matmul prim;
  memory::desc a, b, c, scratch;
  std::string impl;  // oneDNN's name of the kernel it picked
};

// A rows x cols logical matrix stored row-major with leading dimension ld, or (trans) the
// transpose of a cols x rows one: then consecutive logical rows are adjacent elements.
memory::desc matrix(int64_t rows, int64_t cols, memory::data_type t, int64_t ld, bool trans) {
  return memory::desc({rows, cols}, t, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}

Entry build(const Key& k, const memory::desc* packed_b = nullptr) {
  one_openmp_thread_here();
  const memory::data_type t = dnnl_type(k.type);
  const memory::desc a = matrix(k.M, k.K, t, k.lda, k.ta);
  const memory::desc b = packed_b != nullptr ? *packed_b
                         : k.pack_rows != 0  ? memory::desc({k.K, k.N}, t, memory::format_tag::any)
                                             : matrix(k.K, k.N, t, k.ldb, k.tb);
  const memory::desc c = matrix(k.M, k.N, memory::data_type::f32, k.ldc, false);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // C = op(A) op(B) + C, the sum done in fp32 on the fp32 output
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return Entry{dnnl::matmul(pd), a, pd.weights_desc(), c, pd.scratchpad_desc(),
               pd.impl_info_str()};
}

std::string describe(const Key& k) {
  return std::string(to_string(k.type)) + " product M=" + std::to_string(k.M) +
         " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K) + (k.ta ? " A^T" : "") +
         (k.tb ? " B^T" : "") + " lda=" + std::to_string(k.lda) + " ldb=" + std::to_string(k.ldb) +
         " ldc=" + std::to_string(k.ldc) + (k.accumulate ? " (+=)" : "");
}

// The primitive for k, built on first use. Built outside the lock (a build takes tens of
// microseconds to milliseconds); when two threads race on a new key, the first insert wins and
// the other's build is dropped.
std::shared_ptr<const Entry> lookup(const Key& k, const memory::desc* packed_b = nullptr) {
  static auto* mu = new std::shared_mutex;  // never destroyed, as the engine
  static auto* cache = new std::map<Key, std::shared_ptr<const Entry>>;
  {
    const std::shared_lock lock(*mu);
    const auto it = cache->find(k);
    if (it != cache->end()) return it->second;
  }
  std::shared_ptr<const Entry> e;
  try {
    e = std::make_shared<const Entry>(build(k, packed_b));
  } catch (const dnnl::error& err) {
    fail("cpu matmul: oneDNN cannot build the " + describe(k), err, "dnnl::matmul(pd)", __LINE__);
  }
  const std::unique_lock lock(*mu);
  return cache->emplace(k, std::move(e)).first->second;
}

// The calling thread's scratch for oneDNN, grown to the largest size asked for, 64-byte aligned.
void* thread_scratch(size_t bytes) {
  thread_local std::vector<std::byte> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
}

Key key_of(int64_t M, int64_t N, int64_t K, const MatrixRef& A, const MatrixRef& B, int64_t ldc,
           bool accumulate) {
  return Key{M, N, K, A.ld, B.ld, ldc, A.trans, B.trans, accumulate, A.type};
}

// Runs e on this thread. The four memory objects of each primitive are made once per thread and
// pointed at the call's buffers (set_data_handle) instead of made anew on every call (measured:
// about 5% of attention's 1-MFLOP block products).
void execute(const Entry& e, const void* A, const void* B, float* C) {
  const dnnl::engine& eng = cpu_engine();
  // One stream per thread: a cpu stream is only an execution context, but not one to share.
  thread_local dnnl::stream stream(eng);
  struct Mems {
    memory a, b, c, s;
    std::unordered_map<int, memory> args;
  };
  // Entries live as long as the process (the caches never drop one), so their addresses key.
  thread_local std::unordered_map<const Entry*, Mems> mems;
  auto it = mems.find(&e);
  if (it == mems.end()) {
    Mems m{memory(e.a, eng, nullptr), memory(e.b, eng, nullptr), memory(e.c, eng, nullptr),
           memory(e.scratch, eng, nullptr), {}};
    m.args = {{DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c},
              {DNNL_ARG_SCRATCHPAD, m.s}};
    it = mems.emplace(&e, std::move(m)).first;
  }
  Mems& m = it->second;
  m.a.set_data_handle(const_cast<void*>(A));  // read only: oneDNN's API is not const
  m.b.set_data_handle(const_cast<void*>(B));
  m.c.set_data_handle(C);
  m.s.set_data_handle(thread_scratch(e.scratch.get_size()));
  e.prim.execute(stream, m.args);
  stream.wait();
}

}  // namespace

void matmul(int64_t M, int64_t N, int64_t K, const MatrixRef& A, const MatrixRef& B, float* C,
            int64_t ldc, bool accumulate) {
  ZERO_REQUIRE(A.type == B.type, "cpu matmul: operands of types " +
                                     std::string(to_string(A.type)) + " and " +
                                     std::string(to_string(B.type)) + " (expected one type)");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: oneDNN refuses zero-sized operands
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = 0.0f;
    return;
  }
  const Key k = key_of(M, N, K, A, B, ldc, accumulate);
  const std::shared_ptr<const Entry> e = lookup(k);
  one_openmp_thread_here();
  try {
    execute(*e, A.data, B.data, C);
  } catch (const dnnl::error& err) {
    fail("cpu matmul: oneDNN failed to run the " + describe(k), err, "matmul.execute", __LINE__);
  }
}

namespace {

// Buffers for packed weights, kept when a PackedWeight goes and handed to the next one of the
// same size: a step packs the same weights every time, and a packed GPT-2 head (77 MB) is above
// glibc's mmap threshold, so without this each call faulted in fresh pages (measured: as much
// time as the packing itself). At most kKeptBytes are kept; they are not in the memory ledger
// (as the cpu device's block cache, core/cpu_device.cpp).
class PackBuffers {
 public:
  static PackBuffers& get() {
    static auto* b = new PackBuffers;  // never destroyed: PackedWeights may outlive statics
    return *b;
  }
  std::unique_ptr<std::byte[]> take(size_t bytes) {
    {
      const std::lock_guard lock(mu_);
      if (auto it = free_.find(bytes); it != free_.end()) {
        auto p = std::move(it->second);
        free_.erase(it);
        kept_ -= bytes;
        return p;
      }
    }
    return std::unique_ptr<std::byte[]>(new std::byte[bytes]);
  }
  void give(std::unique_ptr<std::byte[]> p, size_t bytes) {
    if (!p) return;
    const std::lock_guard lock(mu_);
    if (kept_ + bytes > kKeptBytes) return;  // p is freed
    free_.emplace(bytes, std::move(p));
    kept_ += bytes;
  }

 private:
  static constexpr size_t kKeptBytes = size_t{256} << 20;
  std::mutex mu_;
  std::multimap<size_t, std::unique_ptr<std::byte[]>> free_;
  size_t kept_ = 0;
};

}  // namespace

struct PackedWeight::Impl {
  int64_t rows, N, K;
  MatrixRef B;
  bool accumulate;
  std::shared_ptr<const Entry> main;  // the rows-row product on the packed B; null: B as given
  std::unique_ptr<std::byte[]> storage;
  size_t storage_bytes = 0;
  void* packed = nullptr;  // 64-byte aligned within storage
  ~Impl() { PackBuffers::get().give(std::move(storage), storage_bytes); }
};

namespace {

// The columns of N that one block of the packed layout `to` holds (the product of its inner
// blocks along dimension 1), or 0 when the layout is not blocked that way.
int64_t column_block(const memory::desc& to) {
  const auto& d = to.data;
  if (d.format_kind != dnnl_blocked) return 0;
  const auto& blk = d.format_desc.blocking;
  int64_t cols = 1;
  for (int i = 0; i < blk.inner_nblks; ++i)
    if (blk.inner_idxs[i] == 1) cols *= blk.inner_blks[i];
  return cols;
}

// The VNNI layout (pack16.hpp) when `to` is one: inner blocks (kb rows, nb columns, 2 rows) in
// that order. Read off the layout, not assumed, so another oneDNN's other choice falls back to its
// reorder.
bool vnni_layout(const memory::desc& to, pack16::VnniLayout* v) {
  const auto& d = to.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 2 || d.offset0 != 0) return false;
  if (d.data_type != dnnl_bf16 && d.data_type != dnnl_f16) return false;
  const auto& blk = d.format_desc.blocking;
  if (blk.inner_nblks != 3 || blk.inner_idxs[0] != 0 || blk.inner_idxs[1] != 1 ||
      blk.inner_idxs[2] != 0 || blk.inner_blks[2] != 2)
    return false;
  *v = pack16::VnniLayout{blk.inner_blks[0], blk.inner_blks[1], blk.strides[0], blk.strides[1],
                          d.padded_dims[0], d.padded_dims[1]};
  return v->Kp % (2 * v->kb) == 0 && v->Np % v->nb == 0;
}

// to (packed, its padding included) = from (B as given, K x N), on oneTBB's threads: our own
// copy for the VNNI layouts above (oneDNN 2.6's reorder into them ran at 1-4 GB/s on the AMX VM:
// with the transposes, a sixth of a GPT-2 step), else oneDNN's reorder, zeroed first, in slices
// of whole column blocks (a slice of the packed layout is one contiguous run of it). Either is an
// exact copy, so the bits do not depend on how many threads run.
void pack(const memory::desc& from_d, const memory::desc& to_d, const MatrixRef& B, void* dst,
          int64_t N) {
  const int64_t K = from_d.dims()[0];
  pack16::VnniLayout v;
  if (vnni_layout(to_d, &v)) {
    tbb::parallel_for(int64_t{0}, v.Np / v.nb, [&](int64_t j) {
      pack16::pack_vnni_block(v, static_cast<const uint16_t*>(B.data), B.ld, B.trans, K, N, j,
                              static_cast<uint16_t*>(dst));
    });
    return;
  }
  const size_t bytes = to_d.get_size();
  constexpr size_t kZeroChunk = size_t{1} << 20;
  tbb::parallel_for(size_t{0}, (bytes + kZeroChunk - 1) / kZeroChunk, [&](size_t c) {
    std::memset(static_cast<std::byte*>(dst) + c * kZeroChunk, 0,
                std::min(kZeroChunk, bytes - c * kZeroChunk));
  });
  const dnnl::engine& eng = cpu_engine();
  const int64_t cb = column_block(to_d);
  // Slices of 4 column blocks (256 columns at 64): few enough reorders, enough of them to share.
  const int64_t width = cb > 0 ? 4 * cb : N;
  const int64_t slices = (N + width - 1) / width;
  tbb::parallel_for(int64_t{0}, slices, [&](int64_t i) {
    one_openmp_thread_here();
    thread_local dnnl::stream stream(eng);
    const int64_t j0 = i * width, nj = std::min(width, N - j0);
    const memory::desc fd = slices == 1 ? from_d : from_d.submemory_desc({K, nj}, {0, j0});
    const memory::desc td = slices == 1 ? to_d : to_d.submemory_desc({K, nj}, {0, j0});
    memory from(fd, eng, const_cast<void*>(B.data));  // read only
    memory to(td, eng, dst);
    dnnl::reorder(from, to).execute(stream, from, to);
    stream.wait();
  });
}

}  // namespace

PackedWeight::PackedWeight(int64_t rows, int64_t N, int64_t K, const MatrixRef& B,
                           bool accumulate)
    : impl_(std::make_unique<Impl>()) {
  impl_->rows = rows;
  impl_->N = N;
  impl_->K = K;
  impl_->B = B;
  impl_->accumulate = accumulate;
  if (rows <= 0 || N == 0 || K == 0) return;
  Key k{rows, N, K, K, B.ld, N, false, B.trans, accumulate, B.type, rows};
  try {
    std::shared_ptr<const Entry> e = lookup(k);
    const memory::desc plain = matrix(K, N, dnnl_type(B.type), B.ld, B.trans);
    // Nothing to pack when the kernel reads B as it is, nor when only a reference kernel takes it.
    if (e->b == plain || e->impl.starts_with("ref")) return;
    const size_t bytes = e->b.get_size();
    impl_->storage_bytes = bytes + 64;
    impl_->storage = PackBuffers::get().take(impl_->storage_bytes);
    const auto p = reinterpret_cast<uintptr_t>(impl_->storage.get());
    impl_->packed = reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
    pack(plain, e->b, B, impl_->packed, N);
    impl_->main = std::move(e);
  } catch (const dnnl::error& err) {
    fail("cpu matmul: oneDNN cannot pack the weight of the " + describe(k), err, "reorder",
         __LINE__);
  }
}

PackedWeight::~PackedWeight() = default;

void PackedWeight::multiply(int64_t M, const MatrixRef& A, float* C, int64_t ldc) const {
  const Impl& w = *impl_;
  ZERO_REQUIRE(A.type == w.B.type && !A.trans,
               "cpu matmul: a packed product needs a row-major left operand of the weight's type");
  if (!w.main || M == 0 || ldc != w.N) {
    matmul(M, w.N, w.K, A, w.B, C, ldc, w.accumulate);
    return;
  }
  std::shared_ptr<const Entry> e = w.main;
  if (M != w.rows || A.ld != w.K) {
    // Another row count or lda: the kernel for it on the packed layout, when oneDNN has one.
    const Key k{M, w.N, w.K, A.ld, 0, ldc, false, false, w.accumulate, w.B.type, w.rows};
    try {
      e = lookup(k, &w.main->b);
    } catch (const Error&) {
      e = nullptr;
    }
    // No kernel for the packed layout at this shape, or only oneDNN's reference loops (seen: fp32
    // with a padded A, hundreds of times slower): B as given.
    if (!e || e->impl.starts_with("ref")) {
      matmul(M, w.N, w.K, A, w.B, C, ldc, w.accumulate);
      return;
    }
  }
  one_openmp_thread_here();
  try {
    execute(*e, A.data, w.packed, C);
  } catch (const dnnl::error& err) {
    fail("cpu matmul: oneDNN failed to run a packed product", err, "matmul.execute", __LINE__);
  }
}

void transpose(int64_t rows, int64_t cols, ScalarType t, const void* src, int64_t ld, void* dst) {
  if (rows == 0 || cols == 0) return;
  if (t == ScalarType::bf16 || t == ScalarType::f16)
    return pack16::transpose(rows, cols, static_cast<const uint16_t*>(src), ld,
                             static_cast<uint16_t*>(dst));
  struct TKey {
    int64_t rows, cols, ld;
    ScalarType t;
    auto operator<=>(const TKey&) const = default;
  };
  struct TEntry {
    dnnl::reorder prim;
    memory::desc from, to;
  };
  static auto* mu = new std::shared_mutex;  // never destroyed, as the matmul cache
  static auto* cache = new std::map<TKey, std::shared_ptr<const TEntry>>;
  const TKey k{rows, cols, ld, t};
  std::shared_ptr<const TEntry> e;
  {
    const std::shared_lock lock(*mu);
    const auto it = cache->find(k);
    if (it != cache->end()) e = it->second;
  }
  one_openmp_thread_here();
  const dnnl::engine& eng = cpu_engine();
  try {
    if (!e) {
      // The destination's logical [cols, rows] as the transposed view of the source.
      const memory::desc from({cols, rows}, dnnl_type(t), memory::dims{1, ld});
      const memory::desc to({cols, rows}, dnnl_type(t), memory::dims{rows, 1});
      const dnnl::reorder::primitive_desc pd(eng, from, eng, to);
      auto made = std::make_shared<const TEntry>(TEntry{dnnl::reorder(pd), from, to});
      const std::unique_lock lock(*mu);
      e = cache->emplace(k, std::move(made)).first->second;
    }
    thread_local dnnl::stream stream(eng);
    const memory a(e->from, eng, const_cast<void*>(src));  // read only
    const memory b(e->to, eng, dst);
    e->prim.execute(stream, {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
    stream.wait();
  } catch (const dnnl::error& err) {
    fail("cpu transpose: oneDNN failed on a " + std::string(to_string(t)) + " " +
             std::to_string(rows) + " x " + std::to_string(cols) + " matrix (ld " +
             std::to_string(ld) + ")",
         err, "dnnl::reorder", __LINE__);
  }
}

namespace {

// The kernel oneDNN picks for a representative square product of type t, or "" when it has
// none. "ref" kernels are oneDNN's plain loops: slower than the fp32 path, so not "supported".
std::string probe(ScalarType t) {
  const int64_t n = 256;
  try {
    const Key k{n, n, n, n, n, n, false, false, false, t};
    return lookup(k)->impl;
  } catch (const Error&) {
    return "";
  }
}

const std::string& impl_of(ScalarType t) {
  static const std::string f32 = probe(ScalarType::f32);
  static const std::string bf16 = probe(ScalarType::bf16);
  static const std::string f16 = probe(ScalarType::f16);
  switch (t) {
    case ScalarType::f32: return f32;
    case ScalarType::bf16: return bf16;
    case ScalarType::f16: return f16;
    default: {
      static const std::string none;
      return none;
    }
  }
}

}  // namespace

bool matmul_supports(ScalarType t) {
  const std::string& impl = impl_of(t);
  return !impl.empty() && impl.find("ref") == std::string::npos;
}

std::string matmul_description(ScalarType t) {
  if (!matmul_supports(t)) return "unsupported";
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + ", " + impl_of(t);
}

}  // namespace zero::models::cpu
