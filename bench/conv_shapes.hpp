// The benchmark suite's convolution shapes (bench/conv_shapes.txt: name N C H W K R stride pad),
// read by bench_ops_gpu and by autotune_report --suite.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cutrain::bench {

struct ConvShape {
  std::string name;
  std::int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0;
  int stride = 1, pad = 0;
};

// The shapes of the file at path; an empty list when it cannot be read. A line that does not
// parse (nine fields, positive sizes) is skipped with its number in `bad`.
inline std::vector<ConvShape> read_conv_shapes(const std::string& path, std::vector<int>* bad = nullptr) {
  std::ifstream in(path);
  std::vector<ConvShape> out;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    ConvShape s;
    if (is >> s.name >> s.n >> s.c >> s.h >> s.w >> s.k >> s.r >> s.stride >> s.pad && s.n > 0 && s.c > 0 &&
        s.h > 0 && s.w > 0 && s.k > 0 && s.r > 0 && s.stride > 0 && s.pad >= 0)
      out.push_back(s);
    else if (bad)
      bad->push_back(number);
  }
  return out;
}

}  // namespace cutrain::bench
