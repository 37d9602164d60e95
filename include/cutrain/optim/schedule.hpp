// Learning-rate schedules as plain functions of the step: opt.set_lr(schedule(step)) before
// opt.step(). Steps count from 0.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::optim {

// Linear warm-up from lr / warmup_steps to lr, then cosine decay to min_lr at total_steps (and
// min_lr after it).
struct CosineSchedule {
  double lr = 0.1;
  std::int64_t total_steps = 1;
  double min_lr = 0.0;
  std::int64_t warmup_steps = 0;

  double operator()(std::int64_t step) const {
    CUTRAIN_REQUIRE(total_steps > warmup_steps && warmup_steps >= 0, InvalidArgument, "optim::CosineSchedule",
                    "need 0 <= warmup_steps < total_steps, got ", warmup_steps, " and ", total_steps);
    CUTRAIN_REQUIRE(std::isfinite(lr) && std::isfinite(min_lr) && lr >= 0 && min_lr >= 0, InvalidArgument,
                    "optim::CosineSchedule", "lr and min_lr must be finite and >= 0, got ", lr, " and ", min_lr);
    if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                              static_cast<double>(total_steps - warmup_steps));
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

// PyTorch's OneCycleLR (two phases, cosine annealing): from max_lr / div_factor up to max_lr over
// the first pct_start of the steps, then down to max_lr / div_factor / final_div_factor at the
// last step (total_steps - 1).
struct OneCycleSchedule {
  double max_lr = 0.1;
  std::int64_t total_steps = 1;
  double pct_start = 0.3;
  double div_factor = 25.0;
  double final_div_factor = 1e4;

  double operator()(std::int64_t step) const {
    CUTRAIN_REQUIRE(std::isfinite(max_lr) && max_lr >= 0, InvalidArgument, "optim::OneCycleSchedule",
                    "max_lr must be finite and >= 0, got ", max_lr);
    CUTRAIN_REQUIRE(total_steps >= 2 && pct_start > 0 && pct_start < 1 && div_factor > 0 && final_div_factor > 0 &&
                        std::isfinite(div_factor) && std::isfinite(final_div_factor),
                    InvalidArgument, "optim::OneCycleSchedule",
                    "need total_steps >= 2, pct_start in (0, 1), positive div factors; got total_steps ", total_steps,
                    ", pct_start ", pct_start, ", div_factor ", div_factor, ", final_div_factor ", final_div_factor);
    const double initial = max_lr / div_factor, final_lr = initial / final_div_factor;
    const double up_end = pct_start * static_cast<double>(total_steps) - 1.0;
    const double down_end = static_cast<double>(total_steps) - 1.0;
    const double s = std::clamp(static_cast<double>(step), 0.0, down_end);
    auto anneal = [](double from, double to, double pct) {
      return to + (from - to) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
    };
    if (s <= up_end) return anneal(initial, max_lr, up_end > 0 ? s / up_end : 1.0);
    return anneal(max_lr, final_lr, (s - up_end) / (down_end - up_end));
  }
};

}  // namespace cutrain::inline CUTRAIN_ABI::optim
