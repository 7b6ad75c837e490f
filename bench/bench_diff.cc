// bench_diff — `fp8ref diff` of two 1 GiB safetensors files against this machine's read bandwidth (issue 3, "Speed").
//
// Compares, never asserts. Writes EXPECTED and ACTUAL (e4m3 data [2^15, 2^15] = 1 GiB each) into a scratch
// directory under /tmp (removed at the end), for three cases:
//   A  identical files (separate files with the same bytes)
//   B  0.1% of the elements differ, at random positions (a different finite code)
//   C  a block of 128 consecutive rows all different (4 Mi elements, 0.39%: each code off by one step)
// and times the diff through the CLI's code path (io::MappedSafetensors of both files, diff::diff_files,
// diff::render_text), best of --reps (default 3), with 1 and 2 threads. The files are in the page cache (they
// were just written; mincore() is checked before every case and the residency printed): this measures the diff,
// not the disk. Next to it, measured in the same run and interleaved with the diff runs, the anchor: a read-only
// pass over the same two mapped files with 2 threads, each thread summing the 64-bit words of its half of both
// files in one loop (two streams per thread, the traffic shape of a diff), (a) over a mapping whose pages are
// already faulted in, as a plain loop and with software prefetch (the diff's kernel prefetches; the faster of the
// two is "read BW", the memory bandwidth proper), (b) over a fresh mapping, page faults included, as the diff sees
// the files, and (c) with 1 thread, for reference. GB/s = bytes of both inputs / time (10^9 bytes).
//
// Memory: a separate, untimed run per case (2 threads) with a sampler thread reading /proc/self/status every
// millisecond: peak RssAnon (= the memory beyond the mapped inputs, whose pages are RssFile), and VmHWM (reset
// through /proc/self/clear_refs before the run) minus RssFile at the end, while both files are still mapped.
//
// Usage: bench_diff [--reps 3] [--dir DIR (default /tmp)] [--keep] [--only A|B|C] [--threads-list 2,1]
// Run with OMP_WAIT_POLICY=passive for the cleanest 1-thread numbers on a 2-core machine (idle OpenMP workers
// otherwise spin briefly after each 2-thread region).

#include <fcntl.h>
#include <malloc.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fp8ref/diff.h"
#include "fp8ref/error.h"
#include "fp8ref/io.h"

namespace {

namespace fs = std::filesystem;
using namespace fp8ref;

constexpr int64_t kRows = int64_t{1} << 15, kCols = int64_t{1} << 15;
constexpr uint64_t kBytes = uint64_t(kRows) * uint64_t(kCols);  // 1 GiB of e4m3 codes
constexpr int64_t kBlockRow0 = 16384, kBlockRows = 128;          // case C

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// EXPECTED's bytes [off, off + n): uniform finite e4m3fn codes (NaN 0x7F/0xFF folded onto +-max), from one seed
// per 8 bytes, so any range can be regenerated independently.
void expected_codes(uint64_t off, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t s = (off + i) * 0x2545F4914F6CDD1Dull;
    uint64_t w = splitmix(s);
    for (int k = 0; k < 8 && i + k < n; ++k) {
      uint8_t c = static_cast<uint8_t>(w >> (8 * k));
      if ((c & 0x7F) == 0x7F) c = static_cast<uint8_t>(c - 1);
      out[i + k] = c;
    }
  }
}

// A different finite code.
uint8_t other_code(uint8_t c, uint8_t mask) {
  uint8_t d = static_cast<uint8_t>(c ^ mask);
  if ((d & 0x7F) == 0x7F) d = static_cast<uint8_t>(c ^ 0x80);
  return d;
}

std::string header_json() {
  std::string h = "{\"output.y\":{\"dtype\":\"F8_E4M3\",\"shape\":[" + std::to_string(kRows) + "," + std::to_string(kCols) +
                  "],\"data_offsets\":[0," + std::to_string(kBytes) + "]}}";
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

void die(const std::string& msg) {
  std::fprintf(stderr, "bench_diff: %s\n", msg.c_str());
  std::exit(2);
}

// Writes a safetensors file whose data comes from fill(offset, buffer, n), 16 MiB at a time; fdatasync'ed so no
// writeback runs during the measurements (the pages stay in the page cache). Returns the count of bytes that
// differ from EXPECTED (as counted by fill).
uint64_t write_file(const std::string& path, const std::function<uint64_t(uint64_t, uint8_t*, size_t)>& fill) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die("cannot create " + path + ": " + std::strerror(errno));
  const std::string h = header_json();
  std::vector<uint8_t> buf(8 + h.size());
  for (int i = 0; i < 8; ++i) buf[i] = static_cast<uint8_t>(uint64_t(h.size()) >> (8 * i));
  std::memcpy(buf.data() + 8, h.data(), h.size());
  auto put = [&](const uint8_t* p, size_t n) {
    while (n) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) die("cannot write " + path + ": " + std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  put(buf.data(), buf.size());
  const size_t kChunk = size_t{4} << 20;
  std::vector<uint8_t> chunk(kChunk);
  uint64_t differ = 0;
  for (uint64_t off = 0; off < kBytes; off += kChunk) {
    differ += fill(off, chunk.data(), kChunk);
    put(chunk.data(), kChunk);
  }
  if (::fdatasync(fd) != 0) die("cannot sync " + path + ": " + std::strerror(errno));
  ::close(fd);
  return differ;
}

// Fraction of the file's pages in the page cache.
double resident(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const size_t size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), pages = (size + page - 1) / page;
  std::vector<unsigned char> v(pages);
  double r = 0;
  if (::mincore(p, size, v.data()) == 0) {
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    r = static_cast<double>(n) / static_cast<double>(pages);
  }
  ::munmap(p, size);
  return r;
}

// ---- /proc --------------------------------------------------------------------------------------------------

// A "Key:   123 kB" field of /proc/self/status, in bytes.
struct Status {
  uint64_t hwm = 0, rss_anon = 0, rss_file = 0;
};
Status read_status() {
  Status s;
  char buf[4096];
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return s;
  buf[n] = 0;
  auto field = [&](const char* key) -> uint64_t {
    const char* p = std::strstr(buf, key);
    return p ? std::strtoull(p + std::strlen(key), nullptr, 10) * 1024 : 0;
  };
  s.hwm = field("VmHWM:");
  s.rss_anon = field("RssAnon:");
  s.rss_file = field("RssFile:");
  return s;
}
bool reset_hwm() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f.flush());
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string l;
  std::getline(f, l);
  return l;
}
// Busy jiffies of all CPUs (user+nice+system+irq+softirq+steal) from /proc/stat.
uint64_t busy_jiffies() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};
  f >> cpu;
  for (auto& x : v) f >> x;
  return v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
}
double own_cpu_s() {
  rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// ---- the measured operations --------------------------------------------------------------------------------

struct DiffRun {
  double seconds = 0;
  uint64_t mismatches = 0;
  std::string verdict, json;
};

// What `fp8ref diff EXPECTED ACTUAL --threads N` does (tools/cmd_diff.cc): map both files, diff, render.
DiffRun cli_diff(const std::string& ep, const std::string& ap, int threads, bool want_json, Status* mem = nullptr) {
  DiffRun r;
  const double t0 = now_s();
  diff::DiffOptions opt;
  opt.threads = threads;
  opt.expected_name = ep;
  opt.actual_name = ap;
  const io::MappedSafetensors expected(ep);
  const io::MappedSafetensors actual(ap);
  const diff::DiffReport rep = diff::diff_files(expected, actual, opt);
  const std::string text = diff::render_text(rep, false);
  r.seconds = now_s() - t0;
  if (mem) *mem = read_status();  // both files still mapped
  if (text.empty()) die("empty report");
  r.verdict = diff::to_string(rep.verdict);
  for (const auto& t : rep.tensors) r.mismatches += t.metrics.numel - t.metrics.bitwise_equal;
  if (want_json) r.json = diff::render_json(rep);
  return r;
}

// The anchor: both files mapped (as the diff maps them), each of `threads` threads sums the 64-bit words of its
// contiguous share of both tensors in one loop. fresh: time the mapping and first touch too.
// prefetch: also software-prefetch 4 KiB ahead in both streams, as the diff's kernel does (the faster of the two
// variants is the bandwidth the diff is compared with).
template <bool Prefetch>
__attribute__((noinline)) uint64_t sum2(const uint64_t* a, const uint64_t* b, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    if (Prefetch && i % 8 == 0) {  // one prefetch per 64-byte line and stream
      __builtin_prefetch(a + i + 512);
      __builtin_prefetch(b + i + 512);
    }
    s0 += a[i] + b[i];
    s1 += a[i + 1] + b[i + 1];
    s2 += a[i + 2] + b[i + 2];
    s3 += a[i + 3] + b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] + b[i];
  return s0 + s1 + s2 + s3;
}
uint64_t read_pass(const io::MappedSafetensors& e, const io::MappedSafetensors& a, int threads, bool prefetch) {
  const auto* pe = reinterpret_cast<const uint64_t*>(e.tensors()[0].bytes);
  const auto* pa = reinterpret_cast<const uint64_t*>(a.tensors()[0].bytes);
  const size_t words = kBytes / 8;
  uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const size_t nt = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
    const size_t b = words * t / nt, en = words * (t + 1) / nt;
    total += prefetch ? sum2<true>(pe + b, pa + b, en - b) : sum2<false>(pe + b, pa + b, en - b);
  }
  return total;
}
double anchor_fresh(const std::string& ep, const std::string& ap, int threads, bool prefetch, uint64_t* sum) {
  const double t0 = now_s();
  const io::MappedSafetensors e(ep), a(ap);
  *sum = read_pass(e, a, threads, prefetch);
  return now_s() - t0;
}
// Returns the times of the plain and the prefetching pass over one mapping whose pages are already faulted in.
std::pair<double, double> anchor_faulted(const std::string& ep, const std::string& ap, int threads, uint64_t* sum) {
  const io::MappedSafetensors e(ep), a(ap);
  read_pass(e, a, threads, false);  // fault everything in
  double t0 = now_s();
  *sum = read_pass(e, a, threads, false);
  const double plain = now_s() - t0;
  t0 = now_s();
  *sum += read_pass(e, a, threads, true);
  return {plain, now_s() - t0};
}

struct Times {
  std::vector<double> t;
  double best() const { return *std::min_element(t.begin(), t.end()); }
  double median() const {
    std::vector<double> s = t;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};
double gbs(double s) { return 2.0 * double(kBytes) / s / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  std::string base = "/tmp", only;
  bool keep = false;
  std::vector<int> thread_list = {2, 1};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--reps") reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--dir") base = next();
    else if (a == "--keep") keep = true;
    else if (a == "--only") only = next();
    else if (a == "--threads-list") {
      thread_list.clear();
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        thread_list.push_back(std::atoi(s.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else die("unknown argument " + a + " (see the comment at the top of bench/bench_diff.cc)");
  }

  // scratch space: EXPECTED + one ACTUAL at a time = 2 GiB (+ headers)
  struct statvfs sv;
  if (::statvfs(base.c_str(), &sv) != 0) die("cannot statvfs " + base);
  const double free_gib = double(sv.f_bavail) * double(sv.f_frsize) / double(1u << 30);
  std::fprintf(stderr, "bench_diff: %.1f GiB free under %s\n", free_gib, base.c_str());
  if (free_gib < 4.0) die("need 4 GiB free under " + base + " (2 GiB of files + margin)");
  const fs::path dir = fs::path(base) / ("fp8ref_bench_diff." + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string ep = (dir / "expected.safetensors").string(), ap = (dir / "actual.safetensors").string();
  auto cleanup = [&] {
    if (keep) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
  };

  const std::string load_before = first_line("/proc/loadavg");
  const uint64_t busy0 = busy_jiffies();
  const double cpu0 = own_cpu_s(), wall0 = now_s();

  double t = now_s();
  write_file(ep, [](uint64_t off, uint8_t* p, size_t n) -> uint64_t {
    expected_codes(off, p, n);
    return 0;
  });
  std::fprintf(stderr, "bench_diff: wrote %s in %.1f s\n", ep.c_str(), now_s() - t);

  struct Case {
    std::string name, what;
    std::function<uint64_t(uint64_t, uint8_t*, size_t)> fill;
  };
  const std::vector<Case> cases = {
      {"A", "identical",
       [](uint64_t off, uint8_t* p, size_t n) -> uint64_t {
         expected_codes(off, p, n);
         return 0;
       }},
      {"B", "0.1% differ (random positions)",
       [](uint64_t off, uint8_t* p, size_t n) -> uint64_t {
         expected_codes(off, p, n);
         uint64_t d = 0;
         for (size_t i = 0; i < n; ++i) {
           uint64_t s = (off + i) ^ 0xD1FFull << 40;
           const uint64_t r = splitmix(s);
           if ((r & 0xFFFFFFFF) < 4294967ull) {  // p = 1/1000
             p[i] = other_code(p[i], static_cast<uint8_t>(1 + (r >> 32) % 0x7F));
             ++d;
           }
         }
         return d;
       }},
      {"C", "rows 16384-16511 all differ (128 rows)",
       [](uint64_t off, uint8_t* p, size_t n) -> uint64_t {
         expected_codes(off, p, n);
         const uint64_t lo = uint64_t(kBlockRow0) * kCols, hi = uint64_t(kBlockRow0 + kBlockRows) * kCols;
         uint64_t d = 0;
         for (size_t i = 0; i < n; ++i)
           if (off + i >= lo && off + i < hi) {
             p[i] = other_code(p[i], 0x01);
             ++d;
           }
         return d;
       }},
  };

  struct Row {
    std::string label;
    int threads;
    Times times;
    uint64_t mismatches;
    std::string verdict;
  };
  std::vector<Row> rows;
  Times fresh2, faulted2, faulted2pf, faulted1;
  struct Mem {
    std::string label;
    uint64_t peak_anon, base_anon, hwm, rss_file;
  };
  std::vector<Mem> mems;
  std::string residency;
  uint64_t checksum = 0;

  for (const Case& c : cases) {
    if (!only.empty() && only != c.name) continue;
    t = now_s();
    const uint64_t injected = write_file(ap, c.fill);
    std::fprintf(stderr, "bench_diff: case %s: wrote %s in %.1f s (%llu elements differ)\n", c.name.c_str(), ap.c_str(),
                 now_s() - t, static_cast<unsigned long long>(injected));
    uint64_t s;
    anchor_faulted(ep, ap, 2, &s);  // warm-up: everything read
    char res[160];
    std::snprintf(res, sizeof res, "case %s: EXPECTED %.1f%%, ACTUAL %.1f%% resident", c.name.c_str(), 100 * resident(ep),
                  100 * resident(ap));
    residency += std::string(residency.empty() ? "" : "; ") + res;

    // thread-count independence of the report (cheap to check here)
    std::string json_ref;
    std::vector<size_t> idx;
    for (int th : thread_list) {
      rows.push_back({"", th, {}, 0, ""});
      idx.push_back(rows.size() - 1);
    }
    for (int rep = 0; rep < reps; ++rep) {
      fresh2.t.push_back(anchor_fresh(ep, ap, 2, true, &s));
      checksum += s;
      auto [plain2, pf2] = anchor_faulted(ep, ap, 2, &s);
      faulted2.t.push_back(plain2);
      faulted2pf.t.push_back(pf2);
      auto [plain1, pf1] = anchor_faulted(ep, ap, 1, &s);
      faulted1.t.push_back(std::min(plain1, pf1));
      for (size_t k = 0; k < thread_list.size(); ++k) {
        const DiffRun d = cli_diff(ep, ap, thread_list[k], rep == 0);
        Row& row = rows[idx[k]];
        row.label = c.name + ": " + c.what;
        row.times.t.push_back(d.seconds);
        row.mismatches = d.mismatches;
        row.verdict = d.verdict;
        if (d.mismatches != injected) die("case " + c.name + ": the diff found " + std::to_string(d.mismatches) +
                                          " mismatches, " + std::to_string(injected) + " were injected");
        if (rep == 0) {
          if (json_ref.empty()) json_ref = d.json;
          else if (d.json != json_ref) die("case " + c.name + ": the JSON report depends on the thread count");
        }
        std::fprintf(stderr, "  case %s %dT rep %d: %.1f ms (%.2f GB/s)  anchor fresh %.1f ms, faulted %.1f / %.1f ms\n",
                     c.name.c_str(), thread_list[k], rep, d.seconds * 1e3, gbs(d.seconds), fresh2.t.back() * 1e3,
                     faulted2.t.back() * 1e3, faulted2pf.t.back() * 1e3);
      }
    }
    // memory: untimed run, 2 threads, sampled
    {
      ::malloc_trim(0);  // what the file writing and the timed runs left in the heap
      const Status before = read_status();
      if (!reset_hwm()) std::fprintf(stderr, "bench_diff: cannot reset VmHWM (clear_refs)\n");
      std::atomic<bool> stop{false};
      std::atomic<uint64_t> peak{0};
      std::thread sampler([&] {
        while (!stop.load()) {
          const uint64_t a = read_status().rss_anon;
          if (a > peak.load()) peak.store(a);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
      Status at_end;
      cli_diff(ep, ap, 2, false, &at_end);
      stop = true;
      sampler.join();
      const uint64_t pk = std::max<uint64_t>({peak.load(), at_end.rss_anon, before.rss_anon});
      mems.push_back({c.name + ": " + c.what, pk, before.rss_anon, at_end.hwm, at_end.rss_file});
    }
  }
  const double wall = now_s() - wall0, own = own_cpu_s() - cpu0;
  const double others = double(busy_jiffies() - busy0) / double(::sysconf(_SC_CLK_TCK)) - own;
  const std::string load_after = first_line("/proc/loadavg");
  cleanup();

  // ---- report (markdown) ----
  const double bw_fresh = gbs(fresh2.best()), bw = std::max(gbs(faulted2.best()), gbs(faulted2pf.best()));
  std::printf("- Inputs: 2 x 1 GiB (`output.y` F8_E4M3 [32768, 32768]: uniform finite codes) under %s, in the page cache\n",
              base.c_str());
  std::printf("  (%s); best of %d, interleaved with the anchors\n", residency.c_str(), reps);
  std::printf("- Load: before %s; after %s; other processes used %.1f CPU·s during the %.1f s run (this one %.1f)\n",
              load_before.c_str(), load_after.c_str(), std::max(0.0, others), wall, own);
  std::printf("- Anchor (2 threads, read-only sum of the 64-bit words of both mapped files, each thread its half of both): "
              "**read BW = %.2f GB/s** with the pages already mapped (plain loop %.2f GB/s, best %.1f ms, median %.1f; "
              "with software prefetch %.2f GB/s, best %.1f ms, median %.1f); %.2f GB/s on a fresh mapping, page faults "
              "included, as the diff maps its inputs (best %.1f ms, median %.1f); checksum %016llx\n",
              bw, gbs(faulted2.best()), faulted2.best() * 1e3, faulted2.median() * 1e3, gbs(faulted2pf.best()),
              faulted2pf.best() * 1e3, faulted2pf.median() * 1e3, bw_fresh, fresh2.best() * 1e3, fresh2.median() * 1e3,
              static_cast<unsigned long long>(checksum));
  std::printf("- For the 1-thread rows: the same pass on 1 thread reads %.2f GB/s (best %.1f ms); the fractions below are "
              "all of the 2-thread bandwidth\n\n",
              gbs(faulted1.best()), faulted1.best() * 1e3);
  std::printf("| case | threads | mismatches | verdict | best of %d (median) | GB/s (both inputs) | / read BW (mapped) | / read BW (fresh map) |\n",
              reps);
  std::printf("|---|---:|---:|---|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %d | %llu | %s | %.1f ms (%.1f) | %.2f | %.2f | %.2f |\n", r.label.c_str(), r.threads,
                static_cast<unsigned long long>(r.mismatches), r.verdict.c_str(), r.times.best() * 1e3,
                r.times.median() * 1e3, gbs(r.times.best()), gbs(r.times.best()) / bw, gbs(r.times.best()) / bw_fresh);
  std::printf("\n| case (2 threads) | peak RssAnon = memory beyond the mapped inputs | RssAnon before | VmHWM | RssFile at end | VmHWM - RssFile |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  auto mib = [](uint64_t b) { return double(b) / double(1u << 20); };
  for (const Mem& m : mems)
    std::printf("| %s | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB |\n", m.label.c_str(), mib(m.peak_anon),
                mib(m.base_anon), mib(m.hwm), mib(m.rss_file), mib(m.hwm) - mib(m.rss_file));
  return 0;
}
