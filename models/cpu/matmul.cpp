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

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ZERO_MATMUL_X86 1
#endif

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

// The copies into packed layouts and transposes below move 32-bit pairs of 16-bit elements. With
// AVX-512 (chosen at run time; the file is built for the baseline ISA) a pair of rows is
// interleaved 16 elements per instruction and 16 x 16 pairs are transposed in registers; without
// it, the scalar loops do the same copies. Either way each output element is one input element.
#ifdef ZERO_MATMUL_X86
bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

// dst (16 rows of 16 uint32, ds bytes apart) = the transpose of src (16 rows, ss bytes apart).
__attribute__((target("avx512f"))) void transpose16x16_u32(const char* src, int64_t ss, char* dst,
                                                             int64_t ds) {
  // maskz forms with every lane set (see zip16_avx512).
  const __mmask16 m16 = 0xffff;
  const __mmask8 m8 = 0xff;
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ss);
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: elements 0,1 (lo) and 2,3 (hi) of a row pair
    t[2 * i] = _mm512_maskz_unpacklo_epi32(m16, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(m16, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + c]: lane L holds column 4L + c of rows 4i .. 4i + 3
    r[4 * i + 0] = _mm512_maskz_unpacklo_epi64(m8, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(m8, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(m8, t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(m8, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512i a = _mm512_maskz_shuffle_i32x4(m16, r[c], r[4 + c], 0x88);
    const __m512i b = _mm512_maskz_shuffle_i32x4(m16, r[8 + c], r[12 + c], 0x88);
    const __m512i e = _mm512_maskz_shuffle_i32x4(m16, r[c], r[4 + c], 0xdd);
    const __m512i f = _mm512_maskz_shuffle_i32x4(m16, r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_maskz_shuffle_i32x4(m16, a, b, 0x88);
    t[8 + c] = _mm512_maskz_shuffle_i32x4(m16, a, b, 0xdd);
    t[4 + c] = _mm512_maskz_shuffle_i32x4(m16, e, f, 0x88);
    t[12 + c] = _mm512_maskz_shuffle_i32x4(m16, e, f, 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * ds, t[i]);
}

// o[n] = a[n] | b[n] << 16 for n < count (a multiple of 16).
__attribute__((target("avx512f"))) void zip16_avx512(const uint16_t* a, const uint16_t* b,
                                                       uint32_t* o, int64_t count) {
  // The maskz forms with every lane set: the same instructions, and no "undefined" source operand
  // for GCC 12 to warn about (-Wmaybe-uninitialized inside its intrinsics headers).
  const __mmask16 all = 0xffff;
  for (int64_t n = 0; n < count; n += 16) {
    const __m512i x = _mm512_maskz_cvtepu16_epi32(
        all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + n)));
    const __m512i y = _mm512_maskz_cvtepu16_epi32(
        all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + n)));
    _mm512_storeu_si512(o + n, _mm512_or_si512(x, _mm512_maskz_slli_epi32(all, y, 16)));
  }
}
#else
bool have_avx512() { return false; }
void transpose16x16_u32(const char*, int64_t, char*, int64_t) {}
void zip16_avx512(const uint16_t*, const uint16_t*, uint32_t*, int64_t) {}
#endif

// o[n] = a[n] | b[n] << 16: two rows of 16-bit elements interleaved.
void zip16(const uint16_t* a, const uint16_t* b, uint32_t* o, int64_t count) {
  int64_t n = 0;
  if (have_avx512()) {
    n = count / 16 * 16;
    zip16_avx512(a, b, o, n);
  }
  for (; n < count; ++n) o[n] = uint32_t{a[n]} | (uint32_t{b[n]} << 16);
}

// oneDNN's packed layout for 16-bit B on its AMX and AVX512-BF16 kernels, when `to` is one: K in
// blocks of 2 * kb rows, N in blocks of nb columns, each block stored as kb pairs of rows, a pair
// interleaved element by element (B[2i][n], B[2i+1][n], B[2i][n+1], ...: "VNNI" order), blocks at
// the outer strides. Found by reading the layout (not assumed), so another oneDNN's other choice
// falls back to its reorder.
struct Vnni {
  int64_t kb, nb;      // pairs of K rows per block, columns per block
  int64_t sk, sn;      // elements between consecutive K blocks, N blocks
  int64_t Kp, Np;      // padded dimensions
};

bool vnni_layout(const memory::desc& to, Vnni* v) {
  const auto& d = to.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 2 || d.offset0 != 0) return false;
  if (d.data_type != dnnl_bf16 && d.data_type != dnnl_f16) return false;
  const auto& blk = d.format_desc.blocking;
  if (blk.inner_nblks != 3 || blk.inner_idxs[0] != 0 || blk.inner_idxs[1] != 1 ||
      blk.inner_idxs[2] != 0 || blk.inner_blks[2] != 2)
    return false;
  *v = Vnni{blk.inner_blks[0], blk.inner_blks[1], blk.strides[0], blk.strides[1],
            d.padded_dims[0], d.padded_dims[1]};
  return v->Kp % (2 * v->kb) == 0 && v->Np % v->nb == 0;
}

uint32_t load32(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

// Column block j (nb columns) of the packed layout v from B[K, N] (b(k, n) = src[k * ld + n], or
// src[n * ld + k] when trans), padding zeroed. Full pairs of rows inside the matrix take the fast
// loops (an interleave of two rows, or a transpose of 32-bit pairs of a transposed B); the edges
// go element by element.
void pack_vnni_block(const Vnni& v, const uint16_t* src, int64_t ld, bool trans, int64_t K,
                     int64_t N, int64_t j, uint16_t* dst) {
  const int64_t n0 = j * v.nb, kstep = 2 * v.kb;
  const bool full_n = n0 + v.nb <= N;
  for (int64_t k0 = 0; k0 < v.Kp; k0 += kstep) {
    uint16_t* out = dst + (k0 / kstep) * v.sk + j * v.sn;
    auto* out32 = reinterpret_cast<uint32_t*>(out);  // 64-byte aligned buffer, even offsets
    if (full_n && k0 + kstep <= K) {
      if (!trans) {
        for (int64_t p = 0; p < v.kb; ++p) {
          const uint16_t* r0 = src + (k0 + 2 * p) * ld + n0;
          zip16(r0, r0 + ld, out32 + p * v.nb, v.nb);
        }
      } else if (have_avx512() && v.kb == 16 && v.nb % 16 == 0) {
        // Rows n of the stored [N, K] matrix hold 16 pairs each here: 16 x 16 transposes.
        for (int64_t q = 0; q < v.nb; q += 16)
          transpose16x16_u32(reinterpret_cast<const char*>(src + (n0 + q) * ld + k0), ld * 2,
                             reinterpret_cast<char*>(out32 + q), v.nb * 4);
      } else {
        for (int64_t n = 0; n < v.nb; ++n) {
          const uint16_t* row = src + (n0 + n) * ld + k0;
          for (int64_t p = 0; p < v.kb; ++p) out32[p * v.nb + n] = load32(row + 2 * p);
        }
      }
      continue;
    }
    for (int64_t p = 0; p < v.kb; ++p)
      for (int64_t n = 0; n < v.nb; ++n)
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t k = k0 + 2 * p + h, c = n0 + n;
          out[(p * v.nb + n) * 2 + h] =
              k < K && c < N ? (trans ? src[c * ld + k] : src[k * ld + c]) : uint16_t{0};
        }
  }
}

// to (packed, its padding included) = from (B as given, K x N), on oneTBB's threads: our own
// copy for the VNNI layouts above (oneDNN 2.6's reorder into them ran at 1-4 GB/s on the AMX VM:
// with the transposes, a sixth of a GPT-2 step), else oneDNN's reorder, zeroed first, in slices
// of whole column blocks (a slice of the packed layout is one contiguous run of it). Either is an
// exact copy, so the bits do not depend on how many threads run.
void pack(const memory::desc& from_d, const memory::desc& to_d, const MatrixRef& B, void* dst,
          int64_t N) {
  const int64_t K = from_d.dims()[0];
  Vnni v;
  if (vnni_layout(to_d, &v)) {
    tbb::parallel_for(int64_t{0}, v.Np / v.nb, [&](int64_t j) {
      pack_vnni_block(v, static_cast<const uint16_t*>(B.data), B.ld, B.trans, K, N, j,
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

namespace {

// dst[cols, rows] = the transpose of the 16-bit rows x cols matrix src (ld): blocks of 32 rows x
// 64 columns go through a 4 KiB tile of 32-bit pairs (two source rows interleaved, a vectorised
// zip), whose 32-bit transpose gives each destination row's 32 elements in order; the edges go
// element by element. oneDNN 2.6's reorder did these copies at about 2 GB/s (ONEDNN_VERBOSE, AMX
// VM); together with the packing below that was a sixth of a GPT-2 step (per-op timing).
void transpose16(int64_t rows, int64_t cols, const uint16_t* src, int64_t ld, uint16_t* dst) {
  constexpr int64_t kR = 32, kC = 64;
  alignas(64) uint32_t tile[kR / 2][kC];
  for (int64_t r0 = 0; r0 < rows; r0 += kR) {
    for (int64_t c0 = 0; c0 < cols; c0 += kC) {
      if (r0 + kR > rows || c0 + kC > cols) {
        const int64_t r1 = std::min(rows, r0 + kR), c1 = std::min(cols, c0 + kC);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * ld + c];
        continue;
      }
      for (int64_t p = 0; p < kR / 2; ++p) {
        const uint16_t* a = src + (r0 + 2 * p) * ld + c0;
        zip16(a, a + ld, tile[p], kC);
      }
      if (have_avx512()) {
        for (int64_t q = 0; q < kC; q += 16)
          transpose16x16_u32(reinterpret_cast<const char*>(&tile[0][q]), kC * 4,
                             reinterpret_cast<char*>(dst + (c0 + q) * rows + r0), rows * 2);
        continue;
      }
      for (int64_t c = 0; c < kC; ++c) {
        uint32_t row[kR / 2];
        for (int64_t p = 0; p < kR / 2; ++p) row[p] = tile[p][c];
        std::memcpy(dst + (c0 + c) * rows + r0, row, sizeof row);
      }
    }
  }
}

}  // namespace

void transpose(int64_t rows, int64_t cols, ScalarType t, const void* src, int64_t ld, void* dst) {
  if (rows == 0 || cols == 0) return;
  if (t == ScalarType::bf16 || t == ScalarType::f16)
    return transpose16(rows, cols, static_cast<const uint16_t*>(src), ld,
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
