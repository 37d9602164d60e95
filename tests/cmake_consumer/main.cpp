// A project outside cutrain that finds the installed package and runs one op.
#include <cutrain/cpu.hpp>

#include <cstdio>

int main() {
  using namespace cutrain;
  auto x = Tensor<float>::from_vector({-1.f, 2.f}, {2});
  auto y = ops::activation_forward(x, {.kind = Activation::relu}).to_vector();
  std::printf("cutrain %s consumer: relu(-1, 2) = (%g, %g)\n", version_string, y[0], y[1]);
  return (y[0] == 0.f && y[1] == 2.f) ? 0 : 1;
}
