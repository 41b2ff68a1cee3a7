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

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
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

Entry build(const Key& k) {
  one_openmp_thread_here();
  const memory::data_type t = dnnl_type(k.type);
  const memory::desc a = matrix(k.M, k.K, t, k.lda, k.ta);
  const memory::desc b = matrix(k.K, k.N, t, k.ldb, k.tb);
  const memory::desc c = matrix(k.M, k.N, memory::data_type::f32, k.ldc, false);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // C = op(A) op(B) + C, the sum done in fp32 on the fp32 output
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return Entry{dnnl::matmul(pd), a, b, c, pd.scratchpad_desc(), pd.impl_info_str()};
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
std::shared_ptr<const Entry> lookup(const Key& k) {
  static auto* mu = new std::shared_mutex;  // never destroyed, as the engine
  static auto* cache = new std::map<Key, std::shared_ptr<const Entry>>;
  {
    const std::shared_lock lock(*mu);
    const auto it = cache->find(k);
    if (it != cache->end()) return it->second;
  }
  std::shared_ptr<const Entry> e;
  try {
    e = std::make_shared<const Entry>(build(k));
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
    const dnnl::engine& eng = cpu_engine();
    // One stream per thread: a cpu stream is only an execution context, but not one to share.
    thread_local dnnl::stream stream(eng);
    const memory a(e->a, eng, const_cast<void*>(A.data));  // read only: oneDNN's API is not const
    const memory b(e->b, eng, const_cast<void*>(B.data));
    const memory c(e->c, eng, C);
    const memory s(e->scratch, eng, thread_scratch(e->scratch.get_size()));
    e->prim.execute(stream, {{DNNL_ARG_SRC, a},
                             {DNNL_ARG_WEIGHTS, b},
                             {DNNL_ARG_DST, c},
                             {DNNL_ARG_SCRATCHPAD, s}});
    stream.wait();
  } catch (const dnnl::error& err) {
    fail("cpu matmul: oneDNN failed to run the " + describe(k), err, "matmul.execute", __LINE__);
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
