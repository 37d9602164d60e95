// Bad input to ops/, autograd/, nn/ and optim/ on the CPU: wrong shapes and ranks, undefined
// inputs, parameters out of range, enums out of range, a tensor modified in place after autograd
// saved it. Each case asserts the exception type and that the message names the op and the
// offending shape or value.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cutrain/autograd.hpp"
#include "cutrain/cpu.hpp"
#include "cutrain/nn.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/optim/clip.hpp"
#include "cutrain/optim/grad_scaler.hpp"
#include "cutrain/optim/optimizer.hpp"
#include "cutrain/optim/schedule.hpp"

namespace cutrain_test_bad_input_core {
std::size_t bad_input_core_case_count();  // test_bad_input_core.cpp
}

namespace cutrain_test_bad_input_ops {  // one per file: the unity build compiles files together

using namespace cutrain;
using cutrain::test::bad;
using cutrain::test::BadCase;
using autograd::Var;

namespace {

using F = Tensor<float>;
using I = Tensor<std::int32_t>;
constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr std::int64_t big32 = std::int64_t{1} << 32;

F z(const Shape& s) { return F::zeros(s); }
F ones(const Shape& s) { return F::full(s, 1.0f); }
Var<float> leaf(const Shape& s) { return autograd::parameter(F::full(s, 0.5f)); }
ActivationParams act(int kind) { return {.kind = static_cast<Activation>(kind)}; }
Pool2dParams pool(int k, int s = 0, int pad = 0) { return Pool2dParams::max(k, s, pad); }
Conv2dParams conv(int stride, int pad) { return Conv2dParams::make(stride, pad); }

std::vector<BadCase> op_cases() {
  return {
      // Elementwise.
      bad<InvalidArgument>("add shapes differ", "add", {"[2,3]", "[3,2]"}, [] { (void)ops::add(z({2, 3}), z({3, 2})); }),
      bad<InvalidArgument>("add undefined", "add", {"undefined"}, [] { (void)ops::add(F{}, z({2})); }),
      bad<InvalidArgument>("multiply shapes differ", "multiply", {"[4]", "[5]"}, [] { (void)ops::multiply(z({4}), z({5})); }),
      bad<InvalidArgument>("scale by NaN", "scale", {"alpha", "nan"}, [] { (void)ops::scale(z({2}), nan); }),
      bad<InvalidArgument>("scale by inf", "scale", {"alpha", "inf"}, [] { (void)ops::scale(z({2}), inf); }),
      bad<InvalidArgument>("multiply_backward dy shape", "multiply_backward", {"[3]", "[2]"},
                           [] { (void)ops::multiply_backward(z({2}), z({2}), z({3})); }),
      // Activations.
      bad<InvalidArgument>("activation of undefined", "activation_forward", {"undefined"},
                           [] { (void)ops::activation_forward(F{}, act(1)); }),
      bad<InvalidArgument>("activation kind 42", "activation_forward", {"unknown activation kind 42"},
                           [] { (void)ops::activation_forward(z({3}), act(42)); }),
      bad<InvalidArgument>("activation kind -1", "activation_forward", {"unknown activation kind -1"},
                           [] { (void)ops::activation_forward(z({3}), act(-1)); }),
      bad<InvalidArgument>("activation alpha NaN", "activation_forward", {"alpha", "nan"},
                           [] { (void)ops::activation_forward(z({3}), {.kind = Activation::leaky_relu, .alpha = nan}); }),
      bad<InvalidArgument>("activation_backward kind 9", "activation_backward", {"unknown activation kind 9"},
                           [] { (void)ops::activation_backward(z({3}), z({3}), act(9)); }),
      bad<InvalidArgument>("activation_backward dy shape", "activation_backward", {"dy", "[3]", "[4]"},
                           [] { (void)ops::activation_backward(z({3}), z({4}), act(1)); }),
      bad<InvalidArgument>("linear_activation kind 77", "linear_activation_forward", {"unknown activation kind 77"},
                           [] { (void)ops::linear_activation_forward(z({2, 3}), z({4, 3}), z({4}), act(77)); }),
      bad<InvalidArgument>("conv2d_bias_activation kind 12", "conv2d_bias_activation_forward",
                           {"unknown activation kind 12"}, [] {
                             (void)ops::conv2d_bias_activation_forward(z({1, 1, 3, 3}), z({1, 1, 1, 1}), F{}, act(12),
                                                                       conv(1, 0));
                           }),
      // Softmax and cross entropy.
      bad<InvalidArgument>("softmax axis out of range", "softmax_forward", {"axis 3", "[2,3,4]"},
                           [] { (void)ops::softmax_forward(z({2, 3, 4}), 3); }),
      bad<InvalidArgument>("softmax of no classes", "softmax_forward", {"[2,0]", "C == 0"},
                           [] { (void)ops::softmax_forward(z({2, 0})); }),
      bad<InvalidArgument>("log_softmax axis -2 of 1-d", "log_softmax_forward", {"axis -2", "[5]"},
                           [] { (void)ops::log_softmax_forward(z({5}), -2); }),
      bad<InvalidArgument>("softmax_backward dy shape", "softmax_backward", {"[2,4]"},
                           [] { (void)ops::softmax_backward(z({2, 3}), z({2, 4})); }),
      bad<InvalidArgument>("cross_entropy labels shape", "cross_entropy_forward", {"[2]", "[3]"},
                           [] { (void)ops::cross_entropy_forward(z({2, 4}), I::zeros({3})); }),
      bad<InvalidArgument>("cross_entropy label out of range", "cross_entropy_forward", {"label 7", "index 1"},
                           [] { (void)ops::cross_entropy_forward(z({2, 4}), I::from_vector({0, 7}, {2})); }),
      bad<InvalidArgument>("cross_entropy negative label", "cross_entropy_forward", {"label -1"},
                           [] { (void)ops::cross_entropy_forward(z({2, 4}), I::from_vector({-1, 0}, {2})); }),
      bad<InvalidArgument>("cross_entropy label smoothing 1.5", "cross_entropy_forward", {"1.5"},
                           [] { (void)ops::cross_entropy_forward(z({2, 4}), I::zeros({2}), {.label_smoothing = 1.5}); }),
      bad<InvalidArgument>("cross_entropy reduction 5", "cross_entropy_forward", {"5"}, [] {
        (void)ops::cross_entropy_forward(z({2, 4}), I::zeros({2}), {.reduction = static_cast<Reduction>(5)});
      }),
      bad<InvalidArgument>("cross_entropy 3-d logits", "cross_entropy_forward", {"[2,4,1]"},
                           [] { (void)ops::cross_entropy_forward(z({2, 4, 1}), I::zeros({2})); }),
      bad<InvalidArgument>("cross_entropy no classes", "cross_entropy_forward", {"[2,0]"},
                           [] { (void)ops::cross_entropy_forward(z({2, 0}), I::zeros({2})); }),
      bad<InvalidArgument>("cross_entropy mean of no samples", "cross_entropy_forward", {"[0,3]"},
                           [] { (void)ops::cross_entropy_forward(z({0, 3}), I::zeros({0})); }),
      bad<InvalidArgument>("cross_entropy undefined labels", "cross_entropy_forward", {"labels", "undefined"},
                           [] { (void)ops::cross_entropy_forward(z({2, 4}), I{}); }),
      bad<InvalidArgument>("cross_entropy_backward dloss of 2", "cross_entropy_backward", {"[2]"},
                           [] { (void)ops::cross_entropy_backward(z({2, 4}), I::zeros({2}), z({2})); }),
      // Dropout.
      bad<InvalidArgument>("dropout p 1", "dropout_forward", {"p must be in [0, 1), got 1"},
                           [] { (void)ops::dropout_forward(z({4}), 1.0, 1); }),
      bad<InvalidArgument>("dropout p -0.5", "dropout_forward", {"got -0.5"}, [] { (void)ops::dropout_forward(z({4}), -0.5, 1); }),
      bad<InvalidArgument>("dropout p NaN", "dropout_forward", {"nan"}, [] { (void)ops::dropout_forward(z({4}), nan, 1); }),
      bad<InvalidArgument>("dropout_backward mask shape", "dropout_backward", {"[4]", "[5]"},
                           [] { (void)ops::dropout_backward(z({4}), z({5})); }),
      // Linear.
      bad<InvalidArgument>("linear x 1-d", "linear_forward", {"x must be 2-d", "[3]"},
                           [] { (void)ops::linear_forward(z({3}), z({4, 3})); }),
      bad<InvalidArgument>("linear w 3-d", "linear_forward", {"w must be 2-d", "[4,3,1]"},
                           [] { (void)ops::linear_forward(z({2, 3}), z({4, 3, 1})); }),
      bad<InvalidArgument>("linear features differ", "linear_forward", {"[2,3]", "[4,5]", "3 features"},
                           [] { (void)ops::linear_forward(z({2, 3}), z({4, 5})); }),
      bad<InvalidArgument>("linear bias shape", "linear_forward", {"bias", "[4]", "[5]"},
                           [] { (void)ops::linear_forward(z({2, 3}), z({4, 3}), z({5})); }),
      bad<InvalidArgument>("linear_backward dy shape", "linear_backward", {"dy", "[2,4]", "[2,5]"},
                           [] { (void)ops::linear_backward(z({2, 3}), z({4, 3}), z({2, 5})); }),
      bad<InvalidArgument>("linear undefined w", "linear_forward", {"w", "undefined"},
                           [] { (void)ops::linear_forward(z({2, 3}), F{}); }),
      // Conv2d.
      bad<InvalidArgument>("conv2d x 3-d", "conv2d_forward", {"x must be 4-d", "[1,3,3]"},
                           [] { (void)ops::conv2d_forward(z({1, 3, 3}), z({1, 1, 1, 1}), conv(1, 0)); }),
      bad<InvalidArgument>("conv2d w 2-d", "conv2d_forward", {"w must be 4-d", "[1,1]"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({1, 1}), conv(1, 0)); }),
      bad<InvalidArgument>("conv2d channels differ", "conv2d_forward", {"[1,3,5,5]", "[2,2,3,3]", "3 channels"},
                           [] { (void)ops::conv2d_forward(z({1, 3, 5, 5}), z({2, 2, 3, 3}), conv(1, 0)); }),
      bad<InvalidArgument>("conv2d stride 0", "conv2d_forward", {"stride must be >= 1", "stride 0x0"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({1, 1, 1, 1}), conv(0, 0)); }),
      bad<InvalidArgument>("conv2d negative padding", "conv2d_forward", {"padding", "pad t-1"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({1, 1, 1, 1}), conv(1, -1)); }),
      bad<InvalidArgument>("conv2d dilation 0", "conv2d_forward", {"dilation", "dilation 0x0"}, [] {
        (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({1, 1, 1, 1}), Conv2dParams::make(1, 0, 0));
      }),
      bad<InvalidArgument>("conv2d groups 0", "conv2d_forward", {"groups", "groups 0"}, [] {
        (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({1, 1, 1, 1}), Conv2dParams::make(1, 0, 1, 0));
      }),
      bad<InvalidArgument>("conv2d groups not dividing", "conv2d_forward", {"[1,3,3,3]", "groups 2"}, [] {
        (void)ops::conv2d_forward(z({1, 3, 3, 3}), z({2, 1, 1, 1}), Conv2dParams::make(1, 0, 1, 2));
      }),
      bad<InvalidArgument>("conv2d kernel larger than input", "conv2d_forward", {"5x5", "[1,1,3,3]"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({1, 1, 5, 5}), conv(1, 0)); }),
      bad<InvalidArgument>("conv2d huge padding", "conv2d_forward", {"too large", "pad t1073741824"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 1, 1}), z({1, 1, 1, 1}), conv(1, 1 << 30)); }),
      bad<InvalidArgument>("conv2d huge padding, big kernel", "conv2d_forward", {"too large"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 1, 1}), z({1, 1, 3, 3}), conv(1, 1 << 28)); }),
      bad<InvalidArgument>("conv2d bias shape", "conv2d_forward", {"bias", "[3]"},
                           [] { (void)ops::conv2d_forward(z({1, 1, 3, 3}), z({2, 1, 1, 1}), z({3}), conv(1, 0)); }),
      bad<InvalidArgument>("conv2d zero-size x", "conv2d_forward", {"[0,1,3,3]", "zero"},
                           [] { (void)ops::conv2d_forward(z({0, 1, 3, 3}), z({1, 1, 1, 1}), conv(1, 0)); }),
      bad<InvalidArgument>("conv2d_backward_data x_shape 3-d", "conv2d_backward_data", {"[1,3,3]"},
                           [] { (void)ops::conv2d_backward_data(z({1, 1, 3, 3}), z({1, 1, 1, 1}), Shape{1, 3, 3}, conv(1, 0)); }),
      bad<InvalidArgument>("conv2d_backward_data dy shape", "conv2d_backward_data", {"dy", "[1,1,2,2]"},
                           [] { (void)ops::conv2d_backward_data(z({1, 1, 2, 2}), z({1, 1, 1, 1}), Shape{1, 1, 3, 3}, conv(1, 0)); }),
      bad<InvalidArgument>("conv2d_backward_filter dy shape", "conv2d_backward_filter", {"dy", "[1,2,3,3]"},
                           [] { (void)ops::conv2d_backward_filter(z({1, 2, 3, 3}), z({1, 1, 3, 3}), Shape{1, 1, 1, 1}, conv(1, 0)); }),
      bad<InvalidArgument>("conv2d_backward_bias 2-d", "conv2d_backward_bias", {"[2,3]"},
                           [] { (void)ops::conv2d_backward_bias(z({2, 3})); }),
      // Pooling.
      bad<InvalidArgument>("pool kernel 0", "pool2d_forward", {"kernel", "0x0"}, [] { (void)ops::pool2d_forward(z({1, 1, 4, 4}), pool(0)); }),
      bad<InvalidArgument>("pool stride -1", "pool2d_forward", {"stride", "-1x-1"},
                           [] { (void)ops::pool2d_forward(z({1, 1, 4, 4}), pool(2, -1)); }),
      bad<InvalidArgument>("pool padding of the whole kernel", "pool2d_forward", {"pad_top 2", "kernel_h 2"},
                           [] { (void)ops::pool2d_forward(z({1, 1, 4, 4}), pool(2, 2, 2)); }),
      bad<InvalidArgument>("pool huge padding", "pool2d_forward", {"pad_top 1073741824"},
                           [] { (void)ops::pool2d_forward(z({1, 1, 4, 4}), pool(2, 2, 1 << 30)); }),
      bad<InvalidArgument>("pool negative padding", "pool2d_forward", {"non-negative", "pad t-1"},
                           [] { (void)ops::pool2d_forward(z({1, 1, 4, 4}), pool(2, 2, -1)); }),
      bad<InvalidArgument>("pool mode 9", "pool2d_forward", {"unknown pool mode 9"}, [] {
        Pool2dParams p = pool(2);
        p.mode = static_cast<PoolMode>(9);
        (void)ops::pool2d_forward(z({1, 1, 4, 4}), p);
      }),
      bad<InvalidArgument>("pool x 3-d", "pool2d_forward", {"[1,4,4]"}, [] { (void)ops::pool2d_forward(z({1, 4, 4}), pool(2)); }),
      bad<InvalidArgument>("pool kernel larger than input", "pool2d_forward", {"[1,1,2,2]", "larger"},
                           [] { (void)ops::pool2d_forward(z({1, 1, 2, 2}), pool(5)); }),
      bad<InvalidArgument>("pool output shape overflowing", "pool2d_output_shape", {"too large", "[4294967296,4294967296,2,2]"},
                           [] { (void)pool2d_output_shape(Shape{big32, big32, 2, 2}, pool(1)); }),
      bad<InvalidArgument>("pool2d_backward dy shape", "pool2d_backward", {"dy", "[1,1,3,3]"}, [] {
        (void)ops::pool2d_backward(z({1, 1, 4, 4}), z({1, 1, 2, 2}), z({1, 1, 3, 3}), pool(2));
      }),
      bad<InvalidArgument>("global_avg_pool 2-d", "global_avg_pool_forward", {"[2,3]"},
                           [] { (void)ops::global_avg_pool_forward(z({2, 3})); }),
      bad<InvalidArgument>("global_avg_pool_backward x_shape 3-d", "global_avg_pool_backward", {"[1,2,3]"},
                           [] { (void)ops::global_avg_pool_backward(z({1, 2, 1, 1}), Shape{1, 2, 3}); }),
      // Batch norm.
      bad<InvalidArgument>("batch_norm gamma for 4 channels on x with 3", "batch_norm_forward_training",
                           {"gamma", "[3]", "[2,3,4,4]", "[4]"}, [] {
                             F rm = z({3}), rv = ones({3});
                             (void)ops::batch_norm_forward_training(z({2, 3, 4, 4}), ones({4}), z({3}), rm, rv, {});
                           }),
      bad<InvalidArgument>("batch_norm beta shape", "batch_norm_forward_training", {"beta", "[2,3,4,4]", "[5]"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)ops::batch_norm_forward_training(z({2, 3, 4, 4}), ones({3}), z({5}), rm, rv, {});
      }),
      bad<InvalidArgument>("batch_norm running_var shape", "batch_norm_forward_training", {"running_var", "[2,3,4,4]"}, [] {
        F rm = z({3}), rv = ones({2});
        (void)ops::batch_norm_forward_training(z({2, 3, 4, 4}), ones({3}), z({3}), rm, rv, {});
      }),
      bad<InvalidArgument>("batch_norm eps 0", "batch_norm_forward_training", {"eps", "got 0"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)ops::batch_norm_forward_training(z({2, 3, 4, 4}), ones({3}), z({3}), rm, rv, {.eps = 0});
      }),
      bad<InvalidArgument>("batch_norm eps NaN", "batch_norm_forward_training", {"eps", "nan"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)ops::batch_norm_forward_training(z({2, 3, 4, 4}), ones({3}), z({3}), rm, rv, {.eps = nan});
      }),
      bad<InvalidArgument>("batch_norm momentum 2", "batch_norm_forward_training", {"momentum", "2"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)ops::batch_norm_forward_training(z({2, 3, 4, 4}), ones({3}), z({3}), rm, rv, {.momentum = 2});
      }),
      bad<InvalidArgument>("batch_norm 3-d x", "batch_norm_forward_training", {"[2,3,4]"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)ops::batch_norm_forward_training(z({2, 3, 4}), ones({3}), z({3}), rm, rv, {});
      }),
      bad<InvalidArgument>("batch_norm one value per channel", "batch_norm_forward_training", {"[1,3]", "one value per channel"},
                           [] {
                             F rm = z({3}), rv = ones({3});
                             (void)ops::batch_norm_forward_training(z({1, 3}), ones({3}), z({3}), rm, rv, {});
                           }),
      bad<InvalidArgument>("batch_norm empty x", "batch_norm_forward_training", {"[0,3]", "no elements"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)ops::batch_norm_forward_training(z({0, 3}), ones({3}), z({3}), rm, rv, {});
      }),
      bad<InvalidArgument>("batch_norm inference gamma", "batch_norm_forward_inference", {"gamma", "[2,3,4,4]", "[4]"},
                           [] { (void)ops::batch_norm_forward_inference(z({2, 3, 4, 4}), ones({4}), z({3}), z({3}), ones({3})); }),
      bad<InvalidArgument>("batch_norm_backward dy", "batch_norm_backward", {"dy", "[2,3,4,4]", "[2,3,4,5]"},
                           [] { (void)ops::batch_norm_backward(z({2, 3, 4, 4}), z({2, 3, 4, 5}), ones({3}), z({3}), ones({3})); }),
      bad<InvalidArgument>("batch_norm_backward save_mean", "batch_norm_backward", {"save_mean", "[2,3,4,4]", "[1]"},
                           [] { (void)ops::batch_norm_backward(z({2, 3, 4, 4}), z({2, 3, 4, 4}), ones({3}), z({1}), ones({3})); }),
      // Layer norm.
      bad<InvalidArgument>("layer_norm gamma shape", "layer_norm_forward", {"gamma", "[4]"},
                           [] { (void)ops::layer_norm_forward(z({2, 3}), ones({4}), z({3})); }),
      bad<InvalidArgument>("layer_norm eps -1", "layer_norm_forward", {"eps", "-1"},
                           [] { (void)ops::layer_norm_forward(z({2, 3}), ones({3}), z({3}), -1.0); }),
      bad<InvalidArgument>("layer_norm undefined x", "layer_norm_forward", {"x", "undefined"},
                           [] { (void)ops::layer_norm_forward(F{}, ones({3}), z({3})); }),
      // Flatten and cast.
      bad<InvalidArgument>("flatten 1-d", "flatten", {"at least 2-d", "[5]"}, [] { (void)ops::flatten(z({5})); }),
      bad<InvalidArgument>("flatten undefined", "flatten", {"undefined"}, [] { (void)ops::flatten(F{}); }),
      bad<InvalidArgument>("flatten_backward dy", "flatten_backward", {"[2,5]", "[2,3,2]"},
                           [] { (void)ops::flatten_backward(z({2, 5}), Shape{2, 3, 2}, Layout::row_major); }),
      bad<InvalidArgument>("flatten_backward overflowing x_shape", "flatten_backward", {"[2,4294967296,4294967296]"},
                           [] { (void)ops::flatten_backward(z({2, 1}), Shape{2, big32, big32}, Layout::row_major); }),
      bad<InvalidArgument>("flatten_backward strided layout", "flatten_backward", {"strided"},
                           [] { (void)ops::flatten_backward(z({2, 6}), Shape{2, 3, 2}, Layout::strided); }),
      bad<InvalidArgument>("cast undefined", "cast", {"undefined"}, [] { (void)ops::cast<double>(F{}); }),
  };
}

std::vector<BadCase> autograd_cases() {
  return {
      bad<InvalidArgument>("linear(Var{}, w)", "autograd::linear", {"x is an undefined"},
                           [] { (void)autograd::linear(Var<float>{}, leaf({4, 3})); }),
      bad<InvalidArgument>("linear(x, Var{})", "autograd::linear", {"w is an undefined"},
                           [] { (void)autograd::linear(leaf({2, 3}), Var<float>{}); }),
      bad<InvalidArgument>("linear_activation(Var{}, w)", "autograd::linear_activation", {"x is an undefined"},
                           [] { (void)autograd::linear_activation(Var<float>{}, leaf({4, 3}), Var<float>{}, act(1)); }),
      bad<InvalidArgument>("add(Var{}, b)", "autograd::add", {"a is an undefined"}, [] { (void)autograd::add(Var<float>{}, leaf({2})); }),
      bad<InvalidArgument>("multiply(a, Var{})", "autograd::multiply", {"b is an undefined"},
                           [] { (void)autograd::multiply(leaf({2}), Var<float>{}); }),
      bad<InvalidArgument>("scale(Var{})", "autograd::scale", {"x is an undefined"}, [] { (void)autograd::scale(Var<float>{}, 2.0); }),
      bad<InvalidArgument>("dropout(Var{})", "autograd::dropout", {"x is an undefined"},
                           [] { (void)autograd::dropout(Var<float>{}, 0.5, 1); }),
      bad<InvalidArgument>("activation(Var{})", "autograd::activation", {"x is an undefined"},
                           [] { (void)autograd::activation(Var<float>{}, act(1)); }),
      bad<InvalidArgument>("conv2d(Var{}, w)", "autograd::conv2d", {"x is an undefined"},
                           [] { (void)autograd::conv2d(Var<float>{}, leaf({1, 1, 1, 1}), Var<float>{}, conv(1, 0)); }),
      bad<InvalidArgument>("conv2d(x, Var{})", "autograd::conv2d", {"w is an undefined"},
                           [] { (void)autograd::conv2d(leaf({1, 1, 3, 3}), Var<float>{}, Var<float>{}, conv(1, 0)); }),
      bad<InvalidArgument>("pool2d(Var{})", "autograd::pool2d", {"x is an undefined"}, [] { (void)autograd::pool2d(Var<float>{}, pool(2)); }),
      bad<InvalidArgument>("global_avg_pool(Var{})", "autograd::global_avg_pool", {"x is an undefined"},
                           [] { (void)autograd::global_avg_pool(Var<float>{}); }),
      bad<InvalidArgument>("flatten(Var{})", "autograd::flatten", {"x is an undefined"}, [] { (void)autograd::flatten(Var<float>{}); }),
      bad<InvalidArgument>("cross_entropy(Var{})", "autograd::cross_entropy", {"logits is an undefined"},
                           [] { (void)autograd::cross_entropy(Var<float>{}, I::zeros({2})); }),
      bad<InvalidArgument>("layer_norm(x, Var{}, b)", "autograd::layer_norm", {"gamma is an undefined"},
                           [] { (void)autograd::layer_norm(leaf({2, 3}), Var<float>{}, leaf({3})); }),
      bad<InvalidArgument>("batch_norm(Var{})", "autograd::batch_norm", {"x is an undefined"}, [] {
        F rm = z({3}), rv = ones({3});
        (void)autograd::batch_norm(Var<float>{}, leaf({3}), leaf({3}), rm, rv, true);
      }),
      bad<InvalidArgument>("Var{}.value()", "Var", {"undefined"}, [] { (void)Var<float>{}.value(); }),
      bad<InvalidArgument>("backward of a root needing no grad", "backward", {"[1]", "does not require grad"},
                           [] { Var<float>(z({1})).backward(); }),
      bad<InvalidArgument>("backward of a non-scalar", "backward", {"[2,3]", "not a scalar"},
                           [] { autograd::scale(leaf({2, 3}), 2.0).backward(); }),
      bad<InvalidArgument>("backward seed shape", "backward", {"seed", "[3]", "[2,3]"},
                           [] { autograd::scale(leaf({2, 3}), 2.0).backward(z({3})); }),
      bad<InvalidArgument>("backward undefined seed", "backward", {"undefined"}, [] { autograd::scale(leaf({2}), 2.0).backward(F{}); }),
      bad<InvalidArgument>("backward twice", "backward", {"freed", "scale"}, [] {
        auto y = autograd::scale(leaf({1}), 2.0);
        y.backward();
        y.backward();
      }),
      bad<InvalidArgument>("set_requires_grad of a non-leaf", "Var::set_requires_grad", {"leaves"},
                           [] { autograd::scale(leaf({1}), 2.0).set_requires_grad(false); }),
      // The version counter: a saved tensor written in place before backward.
      bad<InvalidArgument>("multiply's input filled in place", "backward", {"multiply", "a (f32[2]", "modified in place", "version is 2, it was 1"}, [] {
        auto a = leaf({2}), b = leaf({2});
        auto y = autograd::multiply(a, b);
        a.value().fill(3.0f);
        y.backward(ones({2}));
      }),
      bad<InvalidArgument>("linear's x overwritten by copy_from", "backward", {"linear", "the tensor x", "modified in place"}, [] {
        auto x = leaf({2, 3});
        auto y = autograd::linear(x, leaf({1, 3}));
        x.value().copy_from(ones({2, 3}));
        y.backward(ones({2, 1}));
      }),
      bad<InvalidArgument>("linear's w assigned", "backward", {"linear", "the tensor w", "modified in place"}, [] {
        auto w = leaf({1, 3});
        auto y = autograd::linear(leaf({2, 3}), w);
        w.value().assign({1, 2, 3});
        y.backward(ones({2, 1}));
      }),
      bad<InvalidArgument>("relu's saved tensor filled", "backward", {"relu saved", "modified in place"}, [] {
        auto x = leaf({4});
        auto y = autograd::activation(x, act(1));
        x.value().fill(-1.0f);
        y.backward(ones({4}));
      }),
      bad<InvalidArgument>("a view of a saved tensor filled", "backward", {"multiply", "modified in place"}, [] {
        auto a = leaf({2, 2}), b = leaf({2, 2});
        auto y = autograd::multiply(a, b);
        a.value().reshape({4}).fill(0.0f);  // a view: it shares a's storage and version
        y.backward(ones({2, 2}));
      }),
      bad<InvalidArgument>("cross_entropy's logits filled", "backward", {"cross_entropy", "logits", "modified in place"}, [] {
        auto x = leaf({2, 3});
        auto y = autograd::cross_entropy(x, I::zeros({2}));
        x.value().fill(1.0f);
        y.backward();
      }),
      bad<InvalidArgument>("an optimizer step between forward and backward", "backward", {"linear", "the tensor w", "modified in place"}, [] {
        auto x = leaf({2, 3}), w = leaf({1, 3});
        autograd::linear(x, w).backward(ones({2, 1}));  // w has a gradient now
        auto y = autograd::linear(x, w);
        optim::SGD<float> opt({w}, {.lr = 0.1});
        opt.step();
        y.backward(ones({2, 1}));
      }),
      bad<InvalidArgument>("conv2d's w filled", "backward", {"conv2d", "the tensor w", "modified in place"}, [] {
        auto w = leaf({1, 1, 1, 1});
        auto y = autograd::conv2d(leaf({1, 1, 2, 2}), w, Var<float>{}, conv(1, 0));
        w.value().fill(2.0f);
        y.backward(ones({1, 1, 2, 2}));
      }),
      bad<InvalidArgument>("layer_norm's x filled", "backward", {"layer_norm", "modified in place"}, [] {
        auto x = leaf({2, 3});
        auto y = autograd::layer_norm(x, leaf({3}), leaf({3}));
        x.value().fill(1.0f);
        y.backward(ones({2, 3}));
      }),
  };
}

std::vector<BadCase> nn_cases() {
  return {
      bad<InvalidArgument>("BatchNorm2d features -3", "nn::BatchNorm2d", {"features must be > 0, got -3"},
                           [] { nn::BatchNorm2d<float> bn({.features = -3}); }),
      bad<InvalidArgument>("BatchNorm2d features 0", "nn::BatchNorm2d", {"got 0"}, [] { nn::BatchNorm2d<float> bn({.features = 0}); }),
      bad<InvalidArgument>("BatchNorm2d(4) on 3 channels", "batch_norm_forward_training", {"gamma", "[4]", "[2,3,4,4]"}, [] {
        nn::BatchNorm2d<float> bn({.features = 4});
        (void)bn(Var<float>(z({2, 3, 4, 4})));
      }),
      bad<InvalidArgument>("BatchNorm2d(4) on 3 channels, eval", "batch_norm_forward_inference", {"gamma", "[2,3,4,4]"}, [] {
        nn::BatchNorm2d<float> bn({.features = 4});
        bn.train(false);
        (void)bn(Var<float>(z({2, 3, 4, 4})));
      }),
      bad<InvalidArgument>("Linear in 0", "nn::Linear", {"in 0", "out 3"}, [] { nn::Linear<float> l({.in = 0, .out = 3}); }),
      bad<InvalidArgument>("Linear out -1", "nn::Linear", {"out -1"}, [] { nn::Linear<float> l({.in = 2, .out = -1}); }),
      bad<InvalidArgument>("Linear 2^32 x 2^32", "nn::Linear", {"[4294967296,4294967296]", "too large"},
                           [] { nn::Linear<float> l({.in = big32, .out = big32}); }),
      bad<InvalidArgument>("Linear 2^62 in", "nn::Linear", {"4611686018427387904", "too large"},
                           [] { nn::Linear<float> l({.in = std::int64_t{1} << 62, .out = 1}); }),
      bad<InvalidArgument>("Linear on the wrong features", "linear_forward", {"[2,5]", "[3,4]"}, [] {
        nn::Linear<float> l({.in = 4, .out = 3});
        (void)l(Var<float>(z({2, 5})));
      }),
      bad<InvalidArgument>("Conv2d in 0", "nn::Conv2d", {"in 0"}, [] { nn::Conv2d<float> c({.in = 0, .out = 2}); }),
      bad<InvalidArgument>("Conv2d groups not dividing", "nn::Conv2d", {"groups 2", "in 3"},
                           [] { nn::Conv2d<float> c({.in = 3, .out = 2, .groups = 2}); }),
      bad<InvalidArgument>("Conv2d huge", "nn::Conv2d", {"too large", "in 4294967296"},
                           [] { nn::Conv2d<float> c({.in = big32, .out = big32, .kernel = 3}); }),
      bad<InvalidArgument>("Conv2d on the wrong channels", "conv2d_forward", {"[1,2,5,5]", "channels"}, [] {
        nn::Conv2d<float> c({.in = 3, .out = 2});
        (void)c(Var<float>(z({1, 2, 5, 5})));
      }),
      bad<InvalidArgument>("MaxPool2d kernel 0", "pool2d_forward", {"kernel", "0x0"}, [] {
        nn::MaxPool2d m({.kernel = 0});
        (void)m(Var<float>(z({1, 1, 4, 4})));
      }),
      bad<InvalidArgument>("AvgPool2d padding 3 of kernel 2", "pool2d_forward", {"pad_top 3"}, [] {
        nn::AvgPool2d m({.kernel = 2, .padding = 3});
        (void)m(Var<float>(z({1, 1, 4, 4})));
      }),
      bad<NotImplemented>("AdaptiveAvgPool2d(2)", "nn::AdaptiveAvgPool2d", {"got 2"}, [] { nn::AdaptiveAvgPool2d a(2); }),
      bad<InvalidArgument>("Flatten of 1-d", "flatten", {"[5]"}, [] { (void)nn::Flatten{}(Var<float>(z({5}))); }),
      bad<InvalidArgument>("LayerNorm empty shape", "nn::LayerNorm", {"at least one dim"}, [] { nn::LayerNorm<float> l({.shape = {}}); }),
      bad<InvalidArgument>("LayerNorm negative dim", "nn::LayerNorm", {"[3,-2]"}, [] { nn::LayerNorm<float> l({.shape = {3, -2}}); }),
      bad<InvalidArgument>("LayerNorm overflowing", "nn::LayerNorm", {"[4294967296,4294967296]"},
                           [] { nn::LayerNorm<float> l({.shape = {big32, big32}}); }),
      bad<InvalidArgument>("Dropout p 1.5", "dropout_forward", {"1.5"}, [] {
        nn::Dropout d({.p = 1.5});
        (void)d(Var<float>(z({4})));
      }),
  };
}

std::vector<BadCase> optim_cases() {
  return {
      bad<InvalidArgument>("SGD with no parameters", "optim::SGD", {"no parameters"}, [] { optim::SGD<float> o({}); }),
      bad<InvalidArgument>("AdamW with no parameters", "optim::AdamW", {"no parameters"}, [] { optim::AdamW<float> o({}); }),
      bad<InvalidArgument>("SGD lr -1", "optim::SGD", {"lr", "-1"}, [] { optim::SGD<float> o({leaf({1})}, {.lr = -1}); }),
      bad<InvalidArgument>("SGD lr NaN", "optim::SGD", {"lr", "nan"}, [] { optim::SGD<float> o({leaf({1})}, {.lr = nan}); }),
      bad<InvalidArgument>("SGD momentum -1", "optim::SGD", {"momentum -1"}, [] { optim::SGD<float> o({leaf({1})}, {.momentum = -1}); }),
      bad<InvalidArgument>("SGD weight_decay -0.1", "optim::SGD", {"weight_decay -0.1"},
                           [] { optim::SGD<float> o({leaf({1})}, {.weight_decay = -0.1}); }),
      bad<InvalidArgument>("SGD nesterov without momentum", "optim::SGD", {"nesterov"},
                           [] { optim::SGD<float> o({leaf({1})}, {.nesterov = true}); }),
      bad<InvalidArgument>("SGD set_lr(-1)", "optim::SGD::set_lr", {"got -1"}, [] {
        optim::SGD<float> o({leaf({1})});
        o.set_lr(-1);
      }),
      bad<InvalidArgument>("SGD set_lr(NaN)", "optim::SGD::set_lr", {"got nan"}, [] {
        optim::SGD<float> o({leaf({1})});
        o.set_lr(nan);
      }),
      bad<InvalidArgument>("SGD set_lr(inf)", "optim::SGD::set_lr", {"got inf"}, [] {
        optim::SGD<float> o({leaf({1})});
        o.set_lr(inf);
      }),
      bad<InvalidArgument>("AdamW set_lr(-0.5)", "optim::AdamW::set_lr", {"got -0.5"}, [] {
        optim::AdamW<float> o({leaf({1})});
        o.set_lr(-0.5);
      }),
      bad<InvalidArgument>("AdamW set_lr(NaN)", "optim::AdamW::set_lr", {"got nan"}, [] {
        optim::AdamW<float> o({leaf({1})});
        o.set_lr(nan);
      }),
      bad<InvalidArgument>("SGD of an undefined parameter", "optim::SGD", {"parameter 1"},
                           [] { optim::SGD<float> o({leaf({1}), Var<float>{}}); }),
      bad<InvalidArgument>("SGD of a Var needing no grad", "optim::SGD", {"parameter 0"},
                           [] { optim::SGD<float> o({Var<float>(z({1}))}); }),
      bad<InvalidArgument>("SGD of a non-leaf", "optim::SGD", {"parameter 0", "leaf"},
                           [] { optim::SGD<float> o({autograd::scale(leaf({1}), 2.0)}); }),
      bad<InvalidArgument>("AdamW beta1 1", "optim::AdamW", {"beta1", "got 1"}, [] { optim::AdamW<float> o({leaf({1})}, {.beta1 = 1}); }),
      bad<InvalidArgument>("AdamW beta2 NaN", "optim::AdamW", {"nan"}, [] { optim::AdamW<float> o({leaf({1})}, {.beta2 = nan}); }),
      bad<InvalidArgument>("AdamW eps -1", "optim::AdamW", {"eps -1"}, [] { optim::AdamW<float> o({leaf({1})}, {.eps = -1}); }),
      bad<InvalidArgument>("AdamW lr inf", "optim::AdamW", {"inf"}, [] { optim::AdamW<float> o({leaf({1})}, {.lr = inf}); }),
      bad<InvalidArgument>("clip_grad_norm 0", "optim::clip_grad_norm", {"got 0"},
                           [] { (void)optim::clip_grad_norm(std::vector<Var<float>>{leaf({1})}, 0.0); }),
      bad<InvalidArgument>("clip_grad_norm NaN", "optim::clip_grad_norm", {"got nan"},
                           [] { (void)optim::clip_grad_norm(std::vector<Var<float>>{leaf({1})}, nan); }),
      bad<InvalidArgument>("GradScaler init_scale 0", "optim::GradScaler", {"0"}, [] { optim::GradScaler<float> g({.init_scale = 0}); }),
      bad<InvalidArgument>("GradScaler growth_factor 1", "optim::GradScaler", {"growth_factor", "1"},
                           [] { optim::GradScaler<float> g({.growth_factor = 1}); }),
      bad<InvalidArgument>("GradScaler backoff_factor 1", "optim::GradScaler", {"backoff_factor", "1"},
                           [] { optim::GradScaler<float> g({.backoff_factor = 1}); }),
      bad<InvalidArgument>("GradScaler growth_interval 0", "optim::GradScaler", {"growth_interval", "0"},
                           [] { optim::GradScaler<float> g({.growth_interval = 0}); }),
      bad<InvalidArgument>("CosineSchedule warmup >= total", "optim::CosineSchedule", {"5 and 5"},
                           [] { (void)optim::CosineSchedule{.total_steps = 5, .warmup_steps = 5}(0); }),
      bad<InvalidArgument>("OneCycleSchedule total 1", "optim::OneCycleSchedule", {"total_steps 1"},
                           [] { (void)optim::OneCycleSchedule{.total_steps = 1}(0); }),
      bad<InvalidArgument>("OneCycleSchedule pct_start 0", "optim::OneCycleSchedule", {"pct_start 0"},
                           [] { (void)optim::OneCycleSchedule{.total_steps = 10, .pct_start = 0}(0); }),
      bad<InvalidArgument>("OneCycleSchedule div_factor -1", "optim::OneCycleSchedule", {"div_factor -1"},
                           [] { (void)optim::OneCycleSchedule{.total_steps = 10, .div_factor = -1}(0); }),
      bad<InvalidArgument>("OneCycleSchedule final_div_factor 0", "optim::OneCycleSchedule", {"final_div_factor 0"},
                           [] { (void)optim::OneCycleSchedule{.total_steps = 10, .final_div_factor = 0}(0); }),
      bad<InvalidArgument>("SGD load_state of AdamW state", "optim::SGD::load_state", {"optim::AdamW"}, [] {
        auto p = leaf({2});
        optim::AdamW<float> a({p});
        Checkpoint c;
        a.save_state(c, "opt");
        optim::SGD<float> s({p});
        s.load_state(c, "opt");
      }),
      bad<InvalidArgument>("SGD load_state of another shape", "optim::SGD::load_state", {"[2]", "[3]"}, [] {
        optim::SGD<float> a({leaf({2})});
        Checkpoint c;
        a.save_state(c, "opt");
        optim::SGD<float> s({leaf({3})});
        s.load_state(c, "opt");
      }),
  };
}

}  // namespace

TEST_CASE("bad input: ops", "[bad_input]") { test::run_cases(op_cases()); }
TEST_CASE("bad input: autograd and the version counter", "[bad_input]") { test::run_cases(autograd_cases()); }
TEST_CASE("bad input: nn modules", "[bad_input]") { test::run_cases(nn_cases()); }
TEST_CASE("bad input: optimizers and schedules", "[bad_input]") { test::run_cases(optim_cases()); }

TEST_CASE("bad input: the suite has at least 150 cases", "[bad_input]") {
  const std::size_t n = op_cases().size() + autograd_cases().size() + nn_cases().size() + optim_cases().size() +
                        cutrain_test_bad_input_core::bad_input_core_case_count();
  INFO("cases: " << n);
  CHECK(n >= 150);
}

// What the version counter must not refuse: writes to tensors no op saved, writes after
// backward, and an add, which saves nothing.
TEST_CASE("version counter: only writes to saved tensors before backward are errors", "[bad_input][autograd]") {
  auto a = leaf({2}), b = leaf({2});
  auto y = autograd::add(a, b);
  a.value().fill(3.0f);  // add saved nothing
  y.backward(ones({2}));
  CHECK(a.grad().to_vector() == std::vector<float>{1, 1});

  auto x = leaf({2, 3}), w = leaf({1, 3});
  auto out = autograd::linear(x, w);
  const auto v = w.value().version();
  out.backward(ones({2, 1}));
  w.value().fill(0.0f);  // after backward: what an optimizer step does
  CHECK(w.value().version() == v + 1);
  CHECK(x.grad().to_vector() == std::vector<float>(6, 0.5f));

  // A tensor modified before the op saved it is fine.
  auto p = leaf({3});
  p.value().fill(2.0f);
  auto q = autograd::multiply(p, p);
  q.backward(ones({3}));
  CHECK(p.grad().to_vector() == std::vector<float>(3, 4.0f));
}

}  // namespace cutrain_test_bad_input_ops
