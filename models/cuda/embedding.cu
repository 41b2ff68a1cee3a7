// Token + position embedding, forward and backward.
//
// Forward: one block per token (row b*T + t), threads over the C channels.
//
// Backward, deterministic without float atomics:
//   dwte  The token ids (clamped and checked) are sorted, with their positions as values, by a
//         stable radix sort (cub): equal ids end up adjacent, positions ascending. A second
//         kernel lists the sorted entries that start a run of equal ids (one integer atomicAdd
//         per run gives each its slot; the list's order does not matter, since every run writes
//         its own row). The gradient kernel's grid is (min(N, V, kMaxBlocks / column blocks),
//         C / 256): block (x, y) takes runs x, x + gridDim.x, ... of the list, and for each sums
//         dout over the run's positions, in ascending order, for its 256 channels, and adds the
//         fp32 sum to dwte's row once. So the work is one block-step per run and channel block,
//         not one block per token (N x C/256 blocks, all but one per run exiting at once), and
//         the bits are those of that one-block-per-token scheme. Rows of ids that do not occur
//         are not touched.
//   dwpe  One thread per (t, channel) sums dout[b, t, c] over b in order.
// Vocabulary shards (the tensor-parallel ends): forward writes 0 for tokens outside the shard;
// backward sorts every token as above and skips the runs outside the shard, so the shard's rows
// get bitwise what the whole table's rows would.
#include <cub/device/device_radix_sort.cuh>

#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace {

using namespace detail;

constexpr unsigned kRowThreads = 128;
constexpr unsigned kColThreads = 256;
constexpr unsigned kPrepareThreads = 256;
// Entries of a run a thread loads before it adds them: independent loads in flight, while the
// additions still happen one after another in position order.
constexpr int kBatch = 8;

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                             const T* __restrict__ wte, const T* __restrict__ wpe, int64_t T_,
                             int64_t C, int64_t V, ErrorSink err) {
  const int64_t row = blockIdx.x;
  const int64_t t = row % T_;
  const int32_t raw = tokens[row];
  // One report per bad token; every thread clamps the same way.
  const int64_t tok =
      threadIdx.x == 0 ? checked_id(raw, V, row, err) : (raw < 0 ? 0 : (raw >= V ? V - 1 : raw));
  const T* e = wte + tok * C;
  const T* p = wpe + t * C;
  T* o = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += kRowThreads)
    o[c] = narrow<T>(widen(e[c]) + widen(p[c]));
}

// The vocabulary shard [v0, v0 + Vs) of V: tokens outside it give 0 (another rank has them);
// wpe null: no position term.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_forward_shard_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                   const T* __restrict__ wte, const T* __restrict__ wpe,
                                   int64_t T_, int64_t C, int64_t v0, int64_t Vs, int64_t V,
                                   ErrorSink err) {
  const int64_t row = blockIdx.x;
  const int64_t t = row % T_;
  const int32_t raw = tokens[row];
  const int64_t tok =
      threadIdx.x == 0 ? checked_id(raw, V, row, err) : (raw < 0 ? 0 : (raw >= V ? V - 1 : raw));
  const int64_t local = tok - v0;
  const bool here = local >= 0 && local < Vs;
  const T* e = wte + (here ? local : 0) * C;
  const T* p = wpe ? wpe + t * C : nullptr;
  T* o = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    const float v = here ? widen(e[c]) : 0.0f;
    o[c] = narrow<T>(p ? v + widen(p[c]) : v);
  }
}

// keys[i] = the checked id of token i, positions[i] = i: the input of the sort.
__global__ void __launch_bounds__(kPrepareThreads)
    embedding_sort_prepare_kernel(unsigned* __restrict__ keys, unsigned* __restrict__ positions,
                                  const int32_t* __restrict__ tokens, int64_t N, int64_t V,
                                  ErrorSink err) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += stride) {
    keys[i] = unsigned(checked_id(tokens[i], V, i, err));
    positions[i] = unsigned(i);
  }
}

// runs[0 .. *count) = the sorted entries i that start a run (i == 0 or keys[i - 1] != keys[i]),
// in no particular order. *count is zero on entry.
__global__ void __launch_bounds__(kPrepareThreads)
    embedding_run_starts_kernel(unsigned* __restrict__ runs, unsigned* __restrict__ count,
                                const unsigned* __restrict__ keys, int64_t N) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += stride)
    if (i == 0 || keys[i - 1] != keys[i]) runs[atomicAdd(count, 1u)] = unsigned(i);
}

template <class T, class G>
__global__ void __launch_bounds__(kColThreads)
    embedding_wte_grad_kernel(G* __restrict__ dwte, const T* __restrict__ dout,
                              const unsigned* __restrict__ keys,
                              const unsigned* __restrict__ positions,
                              const unsigned* __restrict__ runs, const unsigned* __restrict__ count,
                              int64_t N, int64_t C, int64_t v0, int64_t Vs) {
  const int64_t c = int64_t(blockIdx.y) * kColThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t R = *count;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t i = runs[r];
    const unsigned key = keys[i];
    // A vocabulary shard adds only its own rows (the whole table: every run is in range).
    if (int64_t(key) < v0 || int64_t(key) >= v0 + Vs) continue;
    float sum = 0.0f;
    bool more = true;
    for (int64_t j = i; more; j += kBatch) {
      // The run is a prefix of the batch (sorted keys: once one differs, the rest do too).
      float v[kBatch];
      bool in[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        in[k] = j + k < N && keys[j + k] == key;
        v[k] = in[k] ? widen(dout[int64_t(positions[j + k]) * C + c]) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (in[k]) sum += v[k];
      more = in[kBatch - 1];
    }
    G* g = dwte + (int64_t(key) - v0) * C + c;
    *g = narrow<G>(widen(*g) + sum);
  }
}

template <class T, class G>
__global__ void __launch_bounds__(kColThreads)
    embedding_wpe_grad_kernel(G* __restrict__ dwpe, const T* __restrict__ dout, int64_t B,
                              int64_t T_, int64_t C) {
  const int64_t t = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * kColThreads + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < B; ++b) sum += widen(dout[(b * T_ + t) * C + c]);
  G* g = dwpe + t * C + c;
  *g = narrow<G>(widen(*g) + sum);
}

// Bits the sort looks at: enough for ids up to V - 1.
int key_bits(int64_t V) {
  int bits = 1;
  while (bits < 32 && (int64_t(1) << bits) < V) ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t N, int64_t V) {
  // A size query: with a null workspace cub only computes the bytes it needs (no launch).
  size_t bytes = 0;
  ZERO_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const unsigned*>(nullptr), static_cast<unsigned*>(nullptr),
      static_cast<const unsigned*>(nullptr), static_cast<unsigned*>(nullptr), int(N), 0,
      key_bits(V)));
  return bytes;
}

}  // namespace

void embedding_forward(DType a, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V, ErrorSink err,
                       cudaStream_t stream) {
  if (B * T == 0) return;
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    embedding_forward_kernel<E><<<unsigned(B * T), kRowThreads, 0, stream>>>(
        static_cast<E*>(out), tokens, static_cast<const E*>(wte), static_cast<const E*>(wpe), T, C,
        V, err);
    check_launch("embedding_forward_kernel", a);
  });
}

void embedding_forward_shard(DType a, void* out, const int32_t* tokens, const void* wte,
                             const void* wpe, int64_t B, int64_t T, int64_t C, int64_t v0,
                             int64_t Vs, int64_t V, ErrorSink err, cudaStream_t stream) {
  if (B * T == 0) return;
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    embedding_forward_shard_kernel<E><<<unsigned(B * T), kRowThreads, 0, stream>>>(
        static_cast<E*>(out), tokens, static_cast<const E*>(wte), static_cast<const E*>(wpe), T, C,
        v0, Vs, V, err);
    check_launch("embedding_forward_shard_kernel", a);
  });
}

size_t embedding_backward_workspace(int64_t N, int64_t V) {
  if (N == 0) return 0;
  return 4 * align_up(size_t(N) * sizeof(unsigned)) + align_up(sort_temp_bytes(N, V)) +
         align_up(sizeof(unsigned));
}

void embedding_backward(DType a, DType g_wte, DType g_wpe, void* dwte, void* dwpe, const void* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V,
                        ErrorSink err, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  embedding_backward_shard(a, g_wte, g_wpe, dwte, dwpe, dout, tokens, B, T, C, 0, V, V, err,
                           workspace, workspace_bytes, stream);
}

void embedding_backward_shard(DType a, DType g_wte, DType g_wpe, void* dwte, void* dwpe,
                              const void* dout, const int32_t* tokens, int64_t B, int64_t T,
                              int64_t C, int64_t v0, int64_t Vs, int64_t V, ErrorSink err,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int64_t N = B * T;
  if (N == 0) return;
  ZERO_REQUIRE(N < (int64_t(1) << 31),
               "embedding_backward: " + std::to_string(N) +
                   " tokens in one call; the cuda kernel sorts at most 2^31 - 1");
  Carver carve(workspace, workspace_bytes);
  unsigned* keys_in = carve.take<unsigned>(size_t(N));
  unsigned* keys = carve.take<unsigned>(size_t(N));
  unsigned* positions_in = carve.take<unsigned>(size_t(N));
  unsigned* positions = carve.take<unsigned>(size_t(N));
  size_t temp_bytes = sort_temp_bytes(N, V);
  char* temp = carve.take<char>(temp_bytes);
  unsigned* run_count = carve.take<unsigned>(1);

  embedding_sort_prepare_kernel<<<grid_for(size_t(N), kPrepareThreads), kPrepareThreads, 0,
                                  stream>>>(keys_in, positions_in, tokens, N, V, err);
  check_launch("embedding_sort_prepare_kernel", a);
  ZERO_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, positions_in,
                                                  positions, int(N), 0, key_bits(V), stream));

  const unsigned col_blocks = ceil_div(C, kColThreads);
  if (col_blocks == 0) return;
  // The run list takes the place of the sort's input keys, which the sort has finished reading
  // (same stream).
  unsigned* runs = keys_in;
  ZERO_CHECK_CUDA(cudaMemsetAsync(run_count, 0, sizeof(unsigned), stream));
  embedding_run_starts_kernel<<<grid_for(size_t(N), kPrepareThreads), kPrepareThreads, 0,
                                stream>>>(runs, run_count, keys, N);
  check_launch("embedding_run_starts_kernel", a);
  // At most min(N, V) runs; blocks past the run count exit at once, so no more of them than
  // kMaxBlocks in all (several waves on any GPU).
  const int64_t run_blocks = std::max<int64_t>(
      1, std::min({N, V, int64_t(kMaxBlocks) / int64_t(col_blocks)}));
  dispatch_grad(a, g_wte, [&](auto ta, auto tg) {
    using E = typename decltype(ta)::type;
    using G = typename decltype(tg)::type;
    embedding_wte_grad_kernel<E, G><<<dim3(unsigned(run_blocks), col_blocks), kColThreads, 0,
                                      stream>>>(static_cast<G*>(dwte), static_cast<const E*>(dout),
                                                keys, positions, runs, run_count, N, C, v0, Vs);
    check_launch("embedding_wte_grad_kernel", a);
  });
  if (dwpe == nullptr) return;  // a shard without the position term
  dispatch_grad(a, g_wpe, [&](auto ta, auto tg) {
    using E = typename decltype(ta)::type;
    using G = typename decltype(tg)::type;
    embedding_wpe_grad_kernel<E, G><<<dim3(unsigned(T), col_blocks), kColThreads, 0, stream>>>(
        static_cast<G*>(dwpe), static_cast<const E*>(dout), B, T, C);
    check_launch("embedding_wpe_grad_kernel", a);
  });
}

}  // namespace zero::models::kernels
