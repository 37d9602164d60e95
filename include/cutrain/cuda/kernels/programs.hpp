// The programs of cutrain's kernels: one factory per kernel source (NAME.cuh, launched by
// NAME.hpp), naming the kernels its launcher looks up, and all_programs(), every instantiation
// the CUDA backend can load. Needs no CUDA headers: the NVRTC compile test builds all_programs().
#pragma once

#include "cutrain/core/abi.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "cutrain/cuda/kernels/activation_cuh.hpp"
#include "cutrain/cuda/kernels/batch_norm_inference_cuh.hpp"
#include "cutrain/cuda/kernels/batch_norm_train_cuh.hpp"
#include "cutrain/cuda/kernels/bias_grad_cuh.hpp"
#include "cutrain/cuda/kernels/broadcast_cuh.hpp"
#include "cutrain/cuda/kernels/cast_cuh.hpp"
#include "cutrain/cuda/kernels/copy_cuh.hpp"
#include "cutrain/cuda/kernels/cross_entropy_cuh.hpp"
#include "cutrain/cuda/kernels/dropout_cuh.hpp"
#include "cutrain/cuda/kernels/elementwise_cuh.hpp"
#include "cutrain/cuda/kernels/index_cuh.hpp"
#include "cutrain/cuda/kernels/layer_norm_cuh.hpp"
#include "cutrain/cuda/kernels/linear_cross_entropy_cuh.hpp"
#include "cutrain/cuda/kernels/optim_cuh.hpp"
#include "cutrain/cuda/kernels/pool2d_cuh.hpp"
#include "cutrain/cuda/kernels/pool2d_dilated_cuh.hpp"
#include "cutrain/cuda/kernels/program.hpp"
#include "cutrain/cuda/kernels/quantize_cuh.hpp"
#include "cutrain/cuda/kernels/reduce_cuh.hpp"
#include "cutrain/cuda/kernels/softmax_cuh.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

// The arguments are device type names (device_type<T>).
namespace programs {

// add, multiply, scale over n contiguous elements laid out alike.
inline Program elementwise(std::string_view t) {
  return make_program("elementwise", source::elementwise, {{"T", t}},
                      {"cutrain_add", "cutrain_add_vec", "cutrain_multiply", "cutrain_scale"});
}

// Broadcasting elementwise ops (rank <= 8, every operand through its own strides): binary ops
// and their local gradients, unary ops and their backward, u8 comparisons, where; the op code an
// int argument (core/params/elementwise.hpp's enums). f32 arithmetic.
inline Program broadcast(std::string_view t) {
  return make_program("broadcast", source::broadcast, {{"T", t}},
                      {"cutrain_bcast_binary", "cutrain_bcast_binary_grad", "cutrain_bcast_unary", "cutrain_bcast_unary_grad",
                       "cutrain_bcast_compare", "cutrain_bcast_where", "cutrain_bcast_where_grad"});
}

// Element type conversion T -> U through f32 (exact for every T; U rounds to nearest even).
inline Program cast(std::string_view from, std::string_view to) {
  return make_program("cast", source::cast, {{"T", from}, {"U", to}}, {"cutrain_cast"});
}

// Inverted dropout with core/random.hpp's generator, reproduced bit for bit: element i (logical
// row-major index) is dropped when uniform_at(seed, i) < p.
inline Program dropout(std::string_view t) {
  return make_program("dropout", source::dropout, {{"T", t}}, {"cutrain_dropout_forward"});
}

// Softmax cross-entropy from logits [N, C] (row-major) and int32 labels [N], with label
// smoothing eps: target q = (1 - eps) onehot(label) + eps / C. One block per row computes the
// row's loss and, in the same pass, its gradient; a second one-block kernel sums the row losses
// in a fixed order (deterministic).
inline Program cross_entropy(std::string_view t) {
  return make_program("cross_entropy", source::cross_entropy, {{"T", t}},
                      {"cutrain_cross_entropy_rows", "cutrain_cross_entropy_reduce"});
}

// Convolution bias gradient db[k] = sum over n, h, w of dy[n, k, h, w], in two deterministic
// stages: S partial sums per channel (f32), then one thread per channel adds its S partials.
inline Program bias_grad(std::string_view t) {
  return make_program("bias_grad", source::bias_grad, {{"T", t}},
                      {"cutrain_bias_grad_nchw", "cutrain_bias_grad_nhwc", "cutrain_bias_grad_finish"});
}

// Optimizer updates, in place on f32 master weights and f32 state, with gradients in G.
// Same rules as PyTorch's SGD and AdamW, computed in f32, per tensor or over lists of tensors
// (foreach, which may also write a 16-bit copy of each weight); and gradient clipping by the
// global norm over lists of tensors (optim/clip.hpp); and the moving average of weights
// (optim/ema.hpp, f32).
inline Program optim(std::string_view grad_type) {
  return make_program("optim", source::optim, {{"G", grad_type}},
                      {"cutrain_sgd_step", "cutrain_adamw_step", "cutrain_sgd_list", "cutrain_adamw_list",
                       "cutrain_unscale_check", "cutrain_clip_sum_squares", "cutrain_clip_coef", "cutrain_clip_scale",
                       "cutrain_ema_update", "cutrain_ema_list"});
}

// 2-d max and average pooling and global average pooling, forward and backward, with the
// semantics of cpu/pool2d.hpp (cuda/kernels/pool2d.hpp says why kernels and not cuDNN). Every
// tensor is indexed by its own strides, so x, y, dy and dx may each be NCHW, NHWC or a strided
// view. Threads walk the tensor they write in its memory order (NHWC: channels fastest), so
// writes and most reads are coalesced. Where channels are innermost and dense in every tensor a
// kernel touches (and C, the strides and the pointers allow it) the _vec kernels move VMAX
// adjacent channels per thread with 16-byte loads and stores; the others one element. Sums in f32.
// Index math is 32-bit (divisions by a multiply-high and a shift) below 2^31 elements, 64-bit
// from there on.
inline Program pool2d(std::string_view t) {
  return make_program("pool2d", source::pool2d, {{"T", t}},
                      {"cutrain_pool2d_forward", "cutrain_pool2d_forward_vec", "cutrain_pool2d_argmax",
                       "cutrain_pool2d_argmax_vec", "cutrain_pool2d_backward", "cutrain_pool2d_backward_vec",
                       "cutrain_pool2d_backward_tiled", "cutrain_pool2d_backward_tiled_vec",
                       "cutrain_global_avg_pool_planes", "cutrain_global_avg_pool_channels",
                       "cutrain_global_avg_pool_backward"});
}

// Dilated 2-d pooling (dilation != 1), max and average, forward and backward, with the semantics
// of cpu/pool2d.hpp: a simple path beside pool2d's fast kernels, one element per thread (the
// backward one per dx element, a gather without atomics that recomputes each window's maximum),
// 64-bit index math, every tensor through its own strides. f32 arithmetic.
inline Program pool2d_dilated(std::string_view t) {
  return make_program("pool2d_dilated", source::pool2d_dilated, {{"T", t}},
                      {"cutrain_pool2d_dilated_forward", "cutrain_pool2d_dilated_backward",
                       "cutrain_pool2d_dilated_indices"});
}

// Batch-norm inference, y = (x - mean[c]) * gamma[c] / sqrt(var[c] + eps) + beta[c], x and y in
// T, the four [C] vectors in f32 (cuda/kernels/batch_norm_inference.hpp says why not cuDNN). Each
// thread computes its channels' scales once, in f64 as the CPU does; the rest is f32. x and y are
// seen as [N, C, S] (S = H W, 1 for a 2-d x), each with its own strides. The _vec kernels move
// VMAX adjacent elements per thread with 16-byte loads and stores (the host checks density and
// alignment); the others one.
inline Program batch_norm_inference(std::string_view t) {
  return make_program("batch_norm_inference", source::batch_norm_inference, {{"T", t}},
                      {"cutrain_batch_norm_inference_rows", "cutrain_batch_norm_inference_rows_vec",
                       "cutrain_batch_norm_inference_planes", "cutrain_batch_norm_inference_planes_vec"});
}

// Layer norm forward over the rows of a row-major [R, d] tensor, with the semantics of
// cpu/layer_norm.hpp: one warp per row, f32 arithmetic in a fixed order; the _vec kernel moves
// VMAX adjacent elements per access (the host checks d and the alignment).
inline Program layer_norm(std::string_view t) {
  return make_program("layer_norm", source::layer_norm, {{"T", t}},
                      {"cutrain_layer_norm_forward", "cutrain_layer_norm_forward_vec"});
}

// Activations over n elements laid out alike, forward and backward, with the semantics of
// cpu/activation.hpp in f32: where cuDNN has no engine for the pointwise node (tiny tensors).
inline Program activation(std::string_view t) {
  return make_program("activation", source::activation, {{"T", t}},
                      {"cutrain_activation_forward", "cutrain_activation_backward", "cutrain_activation_forward_vec",
                       "cutrain_activation_backward_vec"});
}

// Batch-norm training forward (with a fused activation) and backward, x seen as [N, C, S] with
// its own strides, one block per channel: where cuDNN has no engine (odd channel counts); and the
// fast forward and backward of batch norm + activation over dense tensors (reduce, finish,
// apply). The text is activation.cuh followed by batch_norm_train.cuh.
inline Program batch_norm_train(std::string_view t) {
  return make_program("batch_norm_train", std::string(source::activation) + std::string(source::batch_norm_train),
                      {{"T", t}},
                      {"cutrain_batch_norm_train_forward", "cutrain_batch_norm_train_backward", "cutrain_bn_bwd_reduce_cl",
                       "cutrain_bn_bwd_reduce_cf", "cutrain_bn_bwd_finish", "cutrain_bn_bwd_apply_cl",
                       "cutrain_bn_bwd_apply_cf", "cutrain_bn_fwd_reduce_cl", "cutrain_bn_fwd_reduce_cf",
                       "cutrain_bn_fwd_finish", "cutrain_bn_fwd_apply_cl", "cutrain_bn_fwd_apply_cf"});
}

// Strided copy (the host passes core/storage.hpp's StridedCopy::Dims as cutrain_copy_args):
// element i of the logical row-major order goes from src + sum(c_d * src_d) to
// dst + sum(c_d * dst_d), c its multi-index; one kernel per element size.
inline Program copy() {
  return make_program("copy", source::copy, {}, {"cutrain_copy_1", "cutrain_copy_2", "cutrain_copy_4", "cutrain_copy_8"});
}

// Softmax and log-softmax along one axis of a row-major tensor viewed as [outer, C, inner], forward
// and backward, with the semantics of cpu/softmax.hpp. Rows kernels (inner == 1, [N, C]): one block
// per row (grid N); strided-rows kernels: one block per row, elements inner apart (grid outer *
// inner); columns kernels: one thread per row, a grid-stride loop. Blocks are one-dimensional, a
// multiple of 32 threads; f32 arithmetic and accumulation, sums in a fixed order (deterministic).
inline Program softmax(std::string_view t) {
  return make_program("softmax", source::softmax, {{"T", t}},
                      {"cutrain_softmax_forward", "cutrain_log_softmax_forward", "cutrain_softmax_backward",
                       "cutrain_log_softmax_backward", "cutrain_softmax_forward_strided",
                       "cutrain_softmax_backward_strided", "cutrain_softmax_forward_cols",
                       "cutrain_softmax_backward_cols"});
}

// Reductions over any set of axes of a strided tensor (rank <= 8), forward (one block per output,
// f32 accumulation in a fixed order) and backward (one thread per input element).
inline Program reduce(std::string_view t) {
  return make_program("reduce", source::reduce, {{"T", t}},
                      {"cutrain_reduce_sum", "cutrain_reduce_sum_columns", "cutrain_reduce_sum_f32", "cutrain_reduce_var", "cutrain_reduce_norm",
                       "cutrain_reduce_arg", "cutrain_reduce_sum_backward", "cutrain_reduce_arg_backward",
                       "cutrain_reduce_var_backward", "cutrain_reduce_norm_backward"});
}

// index_select and gather over strided tensors (rank <= 8) with int32 indices, forward (a copy
// per element) and backward (each dx element adds, in f32 and in index order, the dy elements
// whose index names it: deterministic), and the range check of an index (a count of the bad
// values and one of them, for the host to read back); an embedding lookup of dense rows with an
// optional position add (the _vec kernel: 16-byte accesses).
inline Program index(std::string_view t) {
  return make_program("index", source::index, {{"T", t}},
                      {"cutrain_index_select", "cutrain_gather", "cutrain_index_select_backward",
                       "cutrain_index_partial_sum", "cutrain_gather_backward", "cutrain_index_check",
                       "cutrain_embedding", "cutrain_embedding_vec", "cutrain_embedding_grad_count",
                       "cutrain_embedding_grad_scan", "cutrain_embedding_grad_place", "cutrain_embedding_grad_rows"});
}

// The fused classifier's cross-entropy (linear_cross_entropy.cuh): the count of labels not
// ignored, the rows' loss with the gradient written over the logits (rows of ld elements), the
// reduction of the row losses, the f32 accumulation of the chunks' weight gradients and the
// scaling of the gradients by the upstream gradient read on the device.
inline Program linear_cross_entropy(std::string_view t) {
  return make_program("linear_cross_entropy", source::linear_cross_entropy, {{"T", t}},
                      {"cutrain_lce_count", "cutrain_lce_rows", "cutrain_lce_reduce", "cutrain_lce_accumulate",
                       "cutrain_lce_scale", "cutrain_lce_scale_f32"});
}

// x / scale as FP8 e4m3 bytes (core/fp8.hpp's rounding), for the deploy engine's 8-bit convolutions.
inline Program quantize(std::string_view t) {
  return make_program("quantize", source::quantize, {{"T", t}}, {"cutrain_quantize_e4m3"});
}

}  // namespace programs

// Every instantiation the CUDA backend can load: what the NVRTC compile test builds.
inline std::vector<Program> all_programs() {
  std::vector<Program> all{programs::copy()};
  for (std::string_view t : device_types) {
    all.push_back(programs::elementwise(t));
    all.push_back(programs::broadcast(t));
    all.push_back(programs::dropout(t));
    all.push_back(programs::cross_entropy(t));
    all.push_back(programs::linear_cross_entropy(t));
    all.push_back(programs::bias_grad(t));
    all.push_back(programs::optim(t));
    all.push_back(programs::pool2d(t));
    all.push_back(programs::pool2d_dilated(t));
    all.push_back(programs::batch_norm_inference(t));
    all.push_back(programs::layer_norm(t));
    all.push_back(programs::softmax(t));
    all.push_back(programs::reduce(t));
    all.push_back(programs::activation(t));
    all.push_back(programs::batch_norm_train(t));
    all.push_back(programs::index(t));
    all.push_back(programs::quantize(t));
    for (std::string_view u : device_types) all.push_back(programs::cast(t, u));
  }
  return all;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
