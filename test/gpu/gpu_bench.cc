// gpu_bench: kvengine's GPU staging path against raw page-locked cudaMemcpyAsync of the
// same bytes, in the same run.
//
//   d2h_put   BatchPut of values in GPU memory   vs  cudaMemcpyAsync D2H into pinned buffers
//   get_h2d   BatchGetInto GPU buffers           vs  cudaMemcpyAsync H2D from pinned buffers
//
// for 1 MiB and 4 MiB values, `--batch` keys per call, `--batches` calls after one warm-up
// call: first on a DB this process opens, then (unless --no_attach) from a client
// attached (DB::Attach) to a DB owned by a second process, this binary re-executed with
// --serve_owner: the client's puts land by DMA in the slots it reserved in the owner's
// shared arena and its gets leave from there.  Prints one line per case and writes the
// same lines to --out:
//   d2h_put 1MiB: kvengine 21.3 GB/s raw 24.9 GB/s ratio 0.86 (batch 16 x 50)
//   attached d2h_put 1MiB: kvengine 20.8 GB/s raw 24.7 GB/s ratio 0.84 (batch 16 x 50)
// Exits 2 without a usable GPU.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "env/gpu_staging.h"
#include "kvengine/db.h"
#include "util/ready_child.h"

namespace {

using kvengine::DB;
using kvengine::Destination;
using kvengine::MutableSlice;
using kvengine::Options;
using kvengine::ReadOptions;
using kvengine::Slice;
using kvengine::Status;
using kvengine::ValueParts;
using kvengine::WriteOptions;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

struct Args {
  std::string out = "gpu_bench.txt";
  std::string dir;
  int batch = 16;
  int batches = 50;
  bool attach = true;
};

struct Case {
  size_t size;
  double put_gbs = 0, put_raw_gbs = 0, get_gbs = 0, get_raw_gbs = 0;
};

// Raw baseline: `batch` copies of `size` bytes between device buffers and page-locked
// host buffers on one stream, then a synchronize, `batches` times.  GB/s.
double RawCopies(const std::vector<char*>& dev, const std::vector<char*>& pinned, size_t size,
                 int batches, bool to_device, cudaStream_t stream) {
  double best = 0;
  for (int round = -1; round < batches; round++) {  // round -1 warms up
    const double t0 = Now();
    for (size_t i = 0; i < dev.size(); i++) {
      if (to_device) {
        cudaMemcpyAsync(dev[i], pinned[i], size, cudaMemcpyHostToDevice, stream);
      } else {
        cudaMemcpyAsync(pinned[i], dev[i], size, cudaMemcpyDeviceToHost, stream);
      }
    }
    cudaStreamSynchronize(stream);
    const double dt = Now() - t0;
    if (round >= 0) best += dt;
  }
  return static_cast<double>(size) * dev.size() * batches / best / 1e9;
}

bool RunCase(DB* db, const Args& args, Case* c) {
  const size_t size = c->size;
  std::vector<char*> dev(args.batch), dev_out(args.batch), pinned(args.batch);
  std::vector<std::string> keys(args.batch);
  for (int i = 0; i < args.batch; i++) {
    if (!Check(cudaMalloc(reinterpret_cast<void**>(&dev[i]), size), "cudaMalloc") ||
        !Check(cudaMalloc(reinterpret_cast<void**>(&dev_out[i]), size), "cudaMalloc") ||
        !Check(cudaMallocHost(reinterpret_cast<void**>(&pinned[i]), size), "cudaMallocHost")) {
      return false;
    }
    std::memset(pinned[i], 'a' + i % 26, size);
    cudaMemcpy(dev[i], pinned[i], size, cudaMemcpyHostToDevice);
    keys[i] = "bench/" + std::to_string(size) + "/" + std::to_string(i);
  }
  cudaStream_t stream;
  if (!Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return false;
  }
  std::vector<Slice> key_slices(keys.begin(), keys.end());
  std::vector<ValueParts> values(args.batch);
  std::vector<Destination> dests(args.batch);
  for (int i = 0; i < args.batch; i++) {
    values[i] = {Slice(dev[i], size)};
    dests[i] = {MutableSlice(dev_out[i], size)};
  }
  const double bytes = static_cast<double>(size) * args.batch * args.batches;
  std::vector<int64_t> results;
  bool ok = true;
  double put_time = 0, get_time = 0;
  for (int round = -1; round < args.batches && ok; round++) {
    double t0 = Now();
    Status s = db->BatchPut(WriteOptions(), key_slices, values, &results);
    const double dt_put = Now() - t0;
    for (int64_t r : results) ok = ok && r == 0;
    t0 = Now();
    s = db->BatchGetInto(ReadOptions(), key_slices, dests, &results);
    const double dt_get = Now() - t0;
    for (int64_t r : results) ok = ok && r == static_cast<int64_t>(size);
    if (!ok) std::fprintf(stderr, "gpu_bench: a batch failed: %s\n", s.ToString().c_str());
    if (round >= 0) {
      put_time += dt_put;
      get_time += dt_get;
    }
  }
  if (ok) {
    // The bytes came back: the last key's value equals what was put.
    std::string a(size, '\0'), b(size, '\0');
    cudaMemcpy(a.data(), dev.back(), size, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), dev_out.back(), size, cudaMemcpyDeviceToHost);
    if (a != b) {
      std::fprintf(stderr, "gpu_bench: bytes differ after put + get\n");
      ok = false;
    }
  }
  c->put_gbs = bytes / put_time / 1e9;
  c->get_gbs = bytes / get_time / 1e9;
  c->put_raw_gbs = RawCopies(dev, pinned, size, args.batches, /*to_device=*/false, stream);
  c->get_raw_gbs = RawCopies(dev_out, pinned, size, args.batches, /*to_device=*/true, stream);
  cudaStreamDestroy(stream);
  for (int i = 0; i < args.batch; i++) {
    cudaFree(dev[i]);
    cudaFree(dev_out[i]);
    cudaFreeHost(pinned[i]);
  }
  return ok;
}

std::string SizeName(size_t size) { return std::to_string(size >> 20) + "MiB"; }

// The DB of both modes: room for three batches of the largest values.
Options BenchOptions(int batch) {
  Options options;
  options.memory_capacity_bytes = (static_cast<uint64_t>(batch) * (4 << 20) * 3) + (64 << 20);
  return options;
}

// --serve_owner SOCKET DIR BATCH: opens the DB serving SOCKET, says "ready" on stdout
// and holds it until stdin closes.  It never touches CUDA.
int ServeOwner(const std::string& socket, const std::string& dir, int batch) {
  Options options = BenchOptions(batch);
  options.local_listen = socket;
  std::unique_ptr<DB> db;
  Status s = DB::Open(options, dir, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_bench owner: %s\n", s.ToString().c_str());
    return 1;
  }
  kvengine::SayReadyAndWaitForStdinToClose();
  return db->Close().ok() ? 0 : 1;
}

// Runs both sizes on db, adding a line per case, prefixed by `label`, to *report and
// stdout.
bool RunCases(DB* db, const Args& args, const std::string& label, std::ostringstream* report) {
  bool ok = true;
  for (size_t size : {size_t{1} << 20, size_t{4} << 20}) {
    Case c{size};
    ok = RunCase(db, args, &c) && ok;
    const struct {
      const char* name;
      double gbs, raw_gbs;
    } lines[] = {{"d2h_put", c.put_gbs, c.put_raw_gbs}, {"get_h2d", c.get_gbs, c.get_raw_gbs}};
    for (const auto& l : lines) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "%s%s %s: kvengine %.2f GB/s raw %.2f GB/s ratio %.2f (batch %d x %d)\n",
                    label.c_str(), l.name, SizeName(size).c_str(), l.gbs, l.raw_gbs,
                    l.gbs / l.raw_gbs, args.batch, args.batches);
      *report << line;
      std::cout << line << std::flush;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--serve_owner") {
    return ServeOwner(argv[2], argv[3], std::atoi(argv[4]));
  }
  Args args;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--out") {
      args.out = next();
    } else if (a == "--dir") {
      args.dir = next();
    } else if (a == "--batch") {
      args.batch = std::atoi(next().c_str());
    } else if (a == "--batches") {
      args.batches = std::atoi(next().c_str());
    } else if (a == "--no_attach") {
      args.attach = false;
    } else {
      std::fprintf(stderr,
                   "usage: gpu_bench [--out FILE] [--dir DB] [--batch N] [--batches N] "
                   "[--no_attach]\n");
      return 1;
    }
  }
  if (args.batch < 1 || args.batches < 1) {
    std::fprintf(stderr, "gpu_bench: --batch and --batches must be positive\n");
    return 1;
  }
  std::string why;
  if (kvengine::CudaDeviceCount(&why) == 0) {
    std::fprintf(stderr, "gpu_bench: no usable GPU (%s)\n", why.c_str());
    return 2;
  }
  if (args.dir.empty()) {
    const char* tmp = std::getenv("KV_TEST_TMPDIR");
    args.dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/gpu_bench_db";
  }
  std::unique_ptr<DB> db;
  Status s = DB::Open(BenchOptions(args.batch), args.dir, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::ostringstream report;
  report << "# gpu_bench on " << prop.name << ": GB/s = 1e9 bytes/s; ratio = kvengine / raw\n";
  std::cout << report.str() << std::flush;
  bool ok = RunCases(db.get(), args, "", &report);
  db->Close();
  db.reset();
  if (args.attach) {
    const std::string owner_dir = args.dir + "_owner";
    kvengine::ReadyChild owner;  // exec'd at once: it inherits none of this process's CUDA
    s = owner.Start(
        {"gpu_bench", "--serve_owner", owner_dir + ".sock", owner_dir, std::to_string(args.batch)},
        60000);
    if (!s.ok()) {
      std::fprintf(stderr, "gpu_bench: %s\n", s.ToString().c_str());
      return 1;
    }
    s = DB::Attach(Options(), owner_dir + ".sock", &db);
    if (!s.ok()) {
      std::fprintf(stderr, "gpu_bench: attach: %s\n", s.ToString().c_str());
      return 1;
    }
    ok = RunCases(db.get(), args, "attached ", &report) && ok;
    db.reset();
  }
  std::ofstream out(args.out);
  out << report.str();
  if (!out) {
    std::fprintf(stderr, "gpu_bench: cannot write %s\n", args.out.c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
