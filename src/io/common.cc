// fp8ref io — dtypes, tensors, memory maps and atomic writes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "io/internal.h"

namespace fp8ref::io {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* tag;
  size_t size;
  int format;  // static_cast<int>(Format) or -1
};

#define FMT(f) static_cast<int>(Format::f)
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1, -1},
    {DType::U8, "U8", 1, -1},
    {DType::I8, "I8", 1, -1},
    {DType::U16, "U16", 2, -1},
    {DType::I16, "I16", 2, -1},
    {DType::U32, "U32", 4, -1},
    {DType::I32, "I32", 4, -1},
    {DType::U64, "U64", 8, -1},
    {DType::I64, "I64", 8, -1},
    {DType::F16, "F16", 2, FMT(f16)},
    {DType::BF16, "BF16", 2, FMT(bf16)},
    {DType::F32, "F32", 4, FMT(f32)},
    {DType::F64, "F64", 8, FMT(f64)},
    {DType::F8_E4M3, "F8_E4M3", 1, FMT(e4m3fn)},
    {DType::F8_E5M2, "F8_E5M2", 1, FMT(e5m2)},
    {DType::F8_E8M0, "F8_E8M0", 1, FMT(ue8m0)},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 1, FMT(e4m3fnuz)},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 1, FMT(e5m2fnuz)},
};
#undef FMT
constexpr size_t kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);

constexpr bool table_in_order() {
  for (size_t i = 0; i < kNumDTypes; ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(table_in_order(), "kDTypes must follow the DType declaration order");

const DTypeInfo& info(DType d) { return kDTypes[static_cast<size_t>(d)]; }

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

const char* dtype_name(DType d) { return info(d).tag; }
size_t dtype_size(DType d) { return info(d).size; }

std::optional<DType> parse_dtype(std::string_view tag) {
  for (const auto& e : kDTypes)
    if (tag == e.tag) return e.dtype;
  return std::nullopt;
}

std::vector<DType> all_dtypes() {
  std::vector<DType> v;
  for (const auto& e : kDTypes) v.push_back(e.dtype);
  return v;
}

std::optional<Format> dtype_format(DType d) {
  int f = info(d).format;
  if (f < 0) return std::nullopt;
  return static_cast<Format>(f);
}

DType format_dtype(Format f) {
  for (const auto& e : kDTypes)
    if (e.format == static_cast<int>(f)) return e.dtype;
  throw InputError(std::string("format ") + format_name(f) + " has no dtype");  // unreachable
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorView view_of(const Tensor& t) {
  TensorView v;
  v.name = t.name;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.bytes = t.data.data();
  v.size = t.data.size();
  return v;
}

Tensor make_tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  uint64_t n = dtype_size(dtype);
  for (int64_t d : t.shape) {
    if (d < 0 || detail::mul_overflow(n, static_cast<uint64_t>(d), &n))
      throw InputError("tensor '" + t.name + "': invalid shape");
  }
  t.data.assign(n, 0);
  return t;
}

// ---- memory map ------------------------------------------------------------------------------

namespace detail {

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open: " + errno_text(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw InputError(path + ": cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw InputError(path + ": cannot map: " + errno_text(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace detail

// ---- atomic writes ---------------------------------------------------------------------------

namespace {

// (directory, base name) of a path; InputError for a path that names no file
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") throw InputError(path + ": not a file name");
  return {dir, base};
}

// `bytes` into a new temporary file beside `path` (same directory: the rename stays on one file system), synced;
// returns its name. InputError naming `path` on failure, with no temporary left behind.
std::string write_temporary(const std::string& path, const uint8_t* bytes, size_t size) {
  const auto [dir, base] = split_path(path);
  const size_t slash = path.rfind('/');
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    uint64_t stamp = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    tmp = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "." + base + ".tmp-" +
          std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(stamp % 1000000007u);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw InputError(path + ": cannot create a temporary file in '" + dir + "': " + errno_text(errno));

  auto fail = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(path + ": " + step + " failed: " + errno_text(err));
  };
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (n == 0) fail("write", EIO);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync", errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) fail("close", errno);
  return tmp;
}

}  // namespace

OutputFiles::~OutputFiles() { discard(); }

void OutputFiles::discard() {
  for (const auto& s : staged_) ::unlink(s.first.c_str());
  staged_.clear();
}

void OutputFiles::add(const std::string& path, const uint8_t* bytes, size_t size) {
  for (const auto& s : staged_)
    if (s.second == path) throw InputError(path + ": given twice as an output");
  staged_.emplace_back(write_temporary(path, bytes, size), path);
}

void OutputFiles::add_npy(const std::string& path, const Tensor& t) {
  std::vector<uint8_t> bytes;
  try {
    bytes = encode_npy(t);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  add(path, bytes);
}

void OutputFiles::commit() {
  // what would make a rename fail is looked for before the first one: a directory where a file is to go
  for (const auto& s : staged_) {
    struct stat st;
    if (::stat(s.second.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw InputError(s.second + ": is a directory; nothing was written");
  }
  std::vector<std::string> dirs;
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (::rename(staged_[i].first.c_str(), staged_[i].second.c_str()) != 0) {
      const int err = errno;
      std::string done;
      for (size_t j = 0; j < i; ++j) done += (done.empty() ? "" : ", ") + staged_[j].second;
      staged_.erase(staged_.begin(), staged_.begin() + static_cast<std::ptrdiff_t>(i));  // (the rest: removed)
      throw InputError(staged_.front().second + ": rename failed: " + errno_text(err) +
                       (done.empty() ? std::string("; nothing was written") : "; already written: " + done));
    }
    const std::string dir = split_path(staged_[i].second).first;
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  staged_.clear();
  // Make the renames themselves durable; best effort (some file systems refuse fsync on a directory).
  for (const std::string& dir : dirs) {
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }
}

void write_file_atomic(const std::string& path, const uint8_t* bytes, size_t size) {
  OutputFiles f;
  f.add(path, bytes, size);
  f.commit();
}

}  // namespace fp8ref::io
