// Compiles every kernel source of the CUDA backend, in every dtype instantiation, with NVRTC for
// sm_90, and checks the NVRTC disk cache's file logic, prebuilding, seed directories and
// prefetch. No GPU needed: nothing here touches the CUDA runtime or driver, so this runs in CI.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/prebuild.hpp"
#include "cutrain/cuda/kernels/programs.hpp"
#include "../scoped_config.hpp"

using namespace cutrain;
using namespace cutrain::cuda::kernels;
using cutrain::test::ScopedConfig;
namespace fs = std::filesystem;

namespace {

// A fresh empty directory under the system's temp directory.
fs::path fresh_dir(const std::string& tag) {
  std::string tmpl = (fs::temp_directory_path() / ("cutrain_" + tag + "_XXXXXX")).string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::size_t count_files(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("every kernel program compiles with NVRTC for sm_90, without warnings") {
  std::printf("NVRTC %s\n", nvrtc_version().c_str());
  const auto programs = all_programs();
  for (const Program& p : programs) {
    INFO("program " << p.name);
    Compiled cubin;
    try {
      cubin = compile(p.source, {"sm_90", true}, p.name + ".cu");
    } catch (const NvrtcError& e) {
      FAIL("NVRTC could not compile " << p.name << ":\n" << e.what());
    }
    CHECK(!cubin.image.empty());
    INFO("NVRTC log: " << cubin.log);
    CHECK(cubin.log.find("warning") == std::string::npos);

    // The PTX names every kernel the host side looks up (extern "C": unmangled).
    const std::string ptx = compile_ptx_for(p.source, 90, p.name + ".cu");
    REQUIRE(!p.kernels.empty());
    for (const auto& k : p.kernels) {
      INFO("kernel " << k);
      CHECK(ptx.find(".entry " + k + "(") != std::string::npos);
    }
    std::printf("nvrtc sm_90 %-36s ok (%zu bytes of CUBIN)\n", p.name.c_str(), cubin.image.size());
  }
}

TEST_CASE("the kernel programs cover every dtype instantiation once") {
  const auto programs = all_programs();
  // One instantiation per dtype of each of these, a cast per dtype pair, and the strided copy
  // (by element size, not dtype).
  const std::vector<std::string> per_dtype = {"elementwise", "dropout", "cross_entropy", "bias_grad", "optim",
                                              "pool2d", "batch_norm_inference", "softmax", "reduce", "activation",
                                              "batch_norm_train", "index", "broadcast", "pool2d_dilated", "quantize",
                                              "layer_norm", "linear_cross_entropy"};
  CHECK(programs.size() == 1 + 3 * per_dtype.size() + 3 * 3);
  std::set<std::string> names;
  for (const auto& p : programs) names.insert(p.name);
  CHECK(names.size() == programs.size());
  for (const auto& name : per_dtype)
    for (const char* t : {"float", "cutrain_bf16", "cutrain_f16"}) CHECK(names.count(name + "_" + t) == 1);
  CHECK(names.count("cast_cutrain_bf16_cutrain_f16") == 1);
  CHECK(names.count("optim_cutrain_f16") == 1);
  CHECK(names.count("copy") == 1);
  CHECK(device_type<float> == "float");
  CHECK(device_type<bfloat16> == "cutrain_bf16");
  CHECK(device_type<half> == "cutrain_f16");
}

TEST_CASE("a kernel that does not compile throws NvrtcError with NVRTC's log") {
  const std::string bad = "extern \"C\" __global__ void broken(float* p) { p[0] = undefined_name; }";
  try {
    compile_ptx_for(bad, 90, "broken.cu");
    FAIL("compiled a broken kernel");
  } catch (const NvrtcError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("undefined_name") != std::string::npos);  // the log is in the message
    CHECK(what.find("broken.cu") != std::string::npos);
  }
}

TEST_CASE("NVRTC targets: CUBIN for a known architecture, PTX for a newer GPU") {
  const Target t90 = target_for(90);
  CHECK(t90.gpu_architecture == "sm_90");
  CHECK(t90.cubin);
  const auto known = nvrtc_supported_archs();
  REQUIRE(!known.empty());
  const Target future = target_for(known.back() + 1);  // a GPU newer than this NVRTC
  CHECK(future.gpu_architecture == "compute_" + std::to_string(known.back()));
  CHECK_FALSE(future.cubin);
  CHECK_THROWS_AS(target_for(10), NvrtcError);
  CHECK(nvrtc_options(t90) == std::vector<std::string>{"--gpu-architecture=sm_90", "-std=c++17"});
}

TEST_CASE("the kernel cache directory follows CUTRAIN_KERNEL_CACHE, XDG_CACHE_HOME, HOME") {
  ScopedConfig home("HOME", "/home/someone");
  {
    ScopedConfig xdg("XDG_CACHE_HOME", "/xdg");
    {
      ScopedConfig own("CUTRAIN_KERNEL_CACHE", "/own/cache");
      CHECK(kernel_cache_dir() == fs::path("/own/cache"));
    }
    ScopedConfig own_empty("CUTRAIN_KERNEL_CACHE", "");
    CHECK(kernel_cache_dir() == fs::path("/xdg/cutrain/kernels"));
  }
  ScopedConfig xdg_empty("XDG_CACHE_HOME", "");
  ScopedConfig own_empty("CUTRAIN_KERNEL_CACHE", "");
  CHECK(kernel_cache_dir() == fs::path("/home/someone/.cache/cutrain/kernels"));
}

TEST_CASE("the cache key changes with the source and the target") {
  const Program a = programs::elementwise("float");
  const Program b = programs::elementwise("cutrain_bf16");
  const Target t90{"sm_90", true}, t80{"sm_80", true};
  CHECK(cache_key(a, t90) == cache_key(a, t90));
  CHECK(cache_key(a, t90) != cache_key(b, t90));
  CHECK(cache_key(a, t90) != cache_key(a, t80));
  CHECK(cache_key(a, t90).size() == 16);
}

TEST_CASE("the disk cache: written atomically after a compile, read back, corrupt files ignored") {
  const fs::path dir = fresh_dir("kernel_cache") / "nested" / "kernels";  // created on first write
  ScopedConfig env("CUTRAIN_KERNEL_CACHE", dir.string());
  // A program no other test compiles, so the counters below are this test's own.
  Program p = programs::cast("float", "cutrain_bf16");
  p.name = "cache_test_" + std::to_string(::getpid());
  p.source += "\n// " + p.name + "\n";
  auto& s = stats();

  const auto compiles0 = s.compiles.load();
  const Image first = image_for(p, 90);
  CHECK(s.compiles.load() == compiles0 + 1);
  CHECK_FALSE(first.from_disk);
  CHECK(first.target.cubin);
  REQUIRE(fs::exists(first.file));
  CHECK(first.file.parent_path() == dir);
  CHECK(first.file.filename().string().find(p.name + "-sm_90-") == 0);
  CHECK(count_files(dir) == 1);  // no temporary file left behind

  const auto hits0 = s.disk_hits.load();
  const Image second = image_for(p, 90);
  CHECK(second.from_disk);
  CHECK(second.bytes == first.bytes);
  CHECK(s.disk_hits.load() == hits0 + 1);
  CHECK(s.compiles.load() == compiles0 + 1);

  SECTION("a corrupt file is ignored and replaced") {
    { std::ofstream(first.file, std::ios::binary | std::ios::trunc) << "not a cubin"; }
    const auto rejects0 = s.disk_rejects.load();
    const Image again = image_for(p, 90);
    CHECK_FALSE(again.from_disk);
    CHECK(again.bytes == first.bytes);
    CHECK(s.disk_rejects.load() == rejects0 + 1);
    CHECK(image_for(p, 90).from_disk);  // rewritten valid
  }
  SECTION("a truncated file is ignored") {
    const auto size = fs::file_size(first.file);
    fs::resize_file(first.file, size / 2);
    const Image again = image_for(p, 90);
    CHECK_FALSE(again.from_disk);
    CHECK(again.bytes == first.bytes);
  }
  SECTION("a flipped payload byte is ignored") {
    {
      std::fstream f(first.file, std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(-1, std::ios::end);
      f.put('\x5a' ^ first.bytes.back());
    }
    CHECK_FALSE(image_for(p, 90).from_disk);
  }
  SECTION("an unreadable cache entry (a directory) is ignored") {
    fs::remove(first.file);
    fs::create_directory(first.file);
    const Image again = image_for(p, 90);
    CHECK_FALSE(again.from_disk);
    CHECK(again.bytes == first.bytes);
    fs::remove(first.file);
  }
  SECTION("use_cache_file = false compiles afresh") {
    CHECK_FALSE(image_for(p, 90, false).from_disk);
  }
  fs::remove_all(dir.parent_path().parent_path());
}

TEST_CASE("a cache directory that cannot be created is skipped, not fatal") {
  const fs::path base = fresh_dir("kernel_cache_file");
  const fs::path blocker = base / "a_file";
  { std::ofstream(blocker) << "x"; }
  ScopedConfig env("CUTRAIN_KERNEL_CACHE", (blocker / "kernels").string());  // below a regular file
  Program p = programs::elementwise("float");
  p.name = "cache_blocked_" + std::to_string(::getpid());
  const Image img = image_for(p, 90);
  CHECK_FALSE(img.from_disk);
  CHECK(!img.bytes.empty());
  CHECK_FALSE(fs::exists(img.file));
  fs::remove_all(base);
}

TEST_CASE("prebuild compiles into the cache on threads; a seed directory spares the compile") {
  const std::vector<Program> two = {programs::activation("float"), programs::cast("float", "cutrain_bf16")};
  const fs::path seed = fresh_dir("kernel_seed");
  {
    ScopedConfig cache("CUTRAIN_KERNEL_CACHE", seed.string());
    ScopedConfig no_seed("CUTRAIN_KERNEL_SEED", "");
    const auto first = prebuild(two, 90, 2);
    CHECK(first.programs == 2);
    CHECK(first.compiled == 2);
    CHECK(first.from_disk == 0);
    CHECK(first.threads == 2);
    CHECK(count_files(seed) == 2);
    const auto again = prebuild(two, 90);
    CHECK(again.compiled == 0);
    CHECK(again.from_disk == 2);
  }
  // A fresh cache with the seed: both images are copied in, nothing is compiled.
  const fs::path cache_dir = fresh_dir("kernel_seeded");
  ScopedConfig cache("CUTRAIN_KERNEL_CACHE", cache_dir.string());
  ScopedConfig with_seed("CUTRAIN_KERNEL_SEED", "/no/such/dir:" + seed.string());
  REQUIRE(kernel_seed_dirs() == std::vector<fs::path>{"/no/such/dir", seed});
  const auto compiles = stats().compiles.load(), seeded = stats().seed_hits.load();
  for (const Program& p : two) {
    const Image img = image_for(p, 90);
    CHECK(img.from_disk);
    CHECK(!img.bytes.empty());
  }
  CHECK(stats().compiles.load() == compiles);
  CHECK(stats().seed_hits.load() == seeded + 2);
  CHECK(count_files(cache_dir) == 2);
  CHECK_THROWS_AS(prebuild(two, 90, -1), InvalidArgument);
}

TEST_CASE("prefetch compiles in the background; a load waits for it instead of compiling again") {
  const fs::path cache_dir = fresh_dir("kernel_prefetch");
  ScopedConfig cache("CUTRAIN_KERNEL_CACHE", cache_dir.string());
  ScopedConfig no_seed("CUTRAIN_KERNEL_SEED", "");
  const std::vector<Program> two = {programs::reduce("float"), programs::softmax("float")};
  const auto compiles = stats().compiles.load();
  CHECK(prefetch(two, 90, 2) == 2);
  CHECK(prefetch(two, 90) == 0);  // queued already
  for (const Program& p : two) CHECK(image_for(p, 90).from_disk);  // waited for the background compile
  CHECK(stats().compiles.load() == compiles + 2);                // each compiled once
  CHECK(count_files(cache_dir) == 2);
  {
    ScopedConfig off("CUTRAIN_KERNEL_PREFETCH", "0");
    CHECK(prefetch({programs::index("float")}, 90) == 0);
  }
  CHECK_THROWS_AS(prefetch(two, 90, 65), InvalidArgument);
  // A load whose program is still queued takes it back and compiles it at once; the prefetch
  // thread skips it: three programs, three compiles.
  const std::vector<Program> three = {programs::batch_norm_train("float"), programs::pool2d("float"),
                                      programs::quantize("float")};
  const auto before = stats().compiles.load();
  CHECK(prefetch(three, 90, 1) == 3);
  CHECK(!image_for(three[2], 90).from_disk);  // taken back from the queue, compiled here
  for (const Program& p : three) CHECK(!image_for(p, 90).bytes.empty());
  CHECK(stats().compiles.load() == before + 3);
  {
    ScopedConfig unwritable("CUTRAIN_KERNEL_CACHE", "/proc/cutrain_no_such_cache");
    CHECK(prefetch({programs::index("float")}, 90) == 0);  // its compiles could reach no launch
  }
  // The programs a dtype can launch: its instantiations, its casts both ways, and the copy.
  const auto f32 = programs_for("float");
  std::set<std::string> names;
  for (const auto& p : f32) names.insert(p.name);
  CHECK(names.count("copy") == 1);
  CHECK(names.count("elementwise_float") == 1);
  CHECK(names.count("cast_float_cutrain_bf16") == 1);
  CHECK(names.count("cast_cutrain_f16_float") == 1);
  CHECK(names.count("elementwise_cutrain_bf16") == 0);
  CHECK(names.count("cast_cutrain_bf16_cutrain_f16") == 0);
  CHECK(f32.size() == 1 + 17 + 5);  // copy, 17 programs, casts float->3 and 2 others->float
  // Mixed precision also launches the f32 programs (master weights, optimizer, loss).
  std::set<std::string> bf;
  for (const auto& p : programs_for("cutrain_bf16")) bf.insert(p.name);
  CHECK(bf.count("elementwise_cutrain_bf16") == 1);
  CHECK(bf.count("optim_float") == 1);
  CHECK(bf.count("elementwise_cutrain_f16") == 0);
  CHECK(bf.size() == 1 + 17 + 17 + 8);  // copy, bf16's and f32's programs, the casts naming either
}
