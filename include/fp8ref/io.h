// fp8ref — file I/O: .npy and safetensors readers/writers, atomic writes, SHA-256.
//
// A Tensor owns its bytes: little-endian, C (row-major) order, exactly numel()·dtype_size() of them.
// Readers validate everything and throw InputError with one line "<path>: <problem>" (naming the
// tensor too where there is one). Writers are atomic: temp file in the same directory, fsync,
// rename; on failure the temp file is removed and the destination is left untouched.
//
//   .npy          read: versions 1.0/2.0/3.0; '<' '>' '|' '=' byte orders (big-endian is swapped);
//                 fortran_order True is transposed into C order; dtypes b1 u1 i1 u2 i2 u4 i4 u8 i8
//                 f2 f4 f8. write: version 1.0 (2.0 if the header needs it), '<', C order. npy has
//                 no FP8 or bf16: F8_* are written as '|u1', BF16 as '<u2' (the raw codes).
//   safetensors   read: memory-mapped; header length, JSON, dtypes, shapes, offsets (inside the
//                 buffer, no overlap, no holes, as the format requires) all checked. Tensors come
//                 back in file (offset) order. read_safetensors copies the tensors out;
//                 MappedSafetensors keeps the mapping and hands out views into it (zero-copy; the
//                 same checks and errors). write: tensors in the given order, header padded with
//                 spaces so the data starts 8-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8ref/format.h"

namespace fp8ref::io {

// Element types, named after the safetensors dtype tags.
enum class DType : uint8_t {
  BOOL, U8, I8, U16, I16, U32, I32, U64, I64,
  F16, BF16, F32, F64,
  F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
};

const char* dtype_name(DType d);                 // the safetensors tag: "F8_E4M3", "BF16", ...
std::optional<DType> parse_dtype(std::string_view tag);  // exact safetensors tag; nullopt if unknown
size_t dtype_size(DType d);                      // bytes per element
std::vector<DType> all_dtypes();                 // declaration order
std::optional<Format> dtype_format(DType d);     // F8_E4M3 -> e4m3fn, BF16 -> bf16, ...; nullopt for ints/bool
DType format_dtype(Format f);                    // the inverse; every Format has a DType

struct Tensor {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;  // empty = scalar (one element)
  std::vector<uint8_t> data;   // little-endian, C order

  int64_t numel() const;       // product of shape (1 for a scalar)
  size_t nbytes() const { return data.size(); }
};

// A tensor whose bytes live elsewhere (a memory map, or a Tensor that outlives the view): the same fields as
// Tensor, with `bytes`/`size` (little-endian, C order, numel()·dtype_size() bytes) in place of `data`.
struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;  // empty = scalar (one element)
  const uint8_t* bytes = nullptr;
  size_t size = 0;

  int64_t numel() const;       // product of shape (1 for a scalar)
  size_t nbytes() const { return size; }
};
// A view of t's bytes (valid while t lives and its data is not resized).
TensorView view_of(const Tensor& t);

// A zero-filled tensor of the right size.
Tensor make_tensor(std::string name, DType dtype, std::vector<int64_t> shape);

// ---- .npy ------------------------------------------------------------------------------------
Tensor read_npy(const std::string& path);                 // name is left empty
void write_npy(const std::string& path, const Tensor& t);  // atomic
// In-memory forms; `what` names the source in error messages.
Tensor decode_npy(const uint8_t* bytes, size_t size, const std::string& what);
std::vector<uint8_t> encode_npy(const Tensor& t);

// ---- safetensors -----------------------------------------------------------------------------
struct SafetensorsFile {
  std::vector<Tensor> tensors;                  // in file order
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty if absent
  // The tensor called `name`, or nullptr.
  const Tensor* find(std::string_view name) const;
};

SafetensorsFile read_safetensors(const std::string& path);  // mmap, validate, copy out

namespace detail {
class MappedFile;
}
// A safetensors file mapped read-only and validated exactly as read_safetensors does (same InputErrors); its
// tensors are views into the mapping, valid as long as this object lives. Nothing is copied: the only memory
// beyond the mapping (page cache, shared) is the parsed header. Move-only.
class MappedSafetensors {
 public:
  explicit MappedSafetensors(const std::string& path);
  ~MappedSafetensors();
  MappedSafetensors(MappedSafetensors&&) noexcept;
  MappedSafetensors& operator=(MappedSafetensors&&) noexcept;

  const std::vector<TensorView>& tensors() const { return tensors_; }   // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"
  const TensorView* find(std::string_view name) const;  // the tensor called `name`, or nullptr
  // The whole mapped file.
  const uint8_t* file_data() const;
  size_t file_size() const;

 private:
  std::unique_ptr<detail::MappedFile> map_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});  // atomic
SafetensorsFile decode_safetensors(const uint8_t* bytes, size_t size, const std::string& what);
std::vector<uint8_t> encode_safetensors(const std::vector<Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata = {});

// ---- helpers ---------------------------------------------------------------------------------
// Several output files written all together or not at all: add() writes each into a temporary file beside its path
// (synced; the path itself untouched), commit() renames them all into place. A failure before commit — a missing
// directory, a full disk, an error while the caller computes a later output — leaves every path as it was: the
// destructor removes the temporaries. commit() refuses a path that is a directory before the first rename; should a
// rename still fail, its InputError names the files already in place. Throws InputError naming the path.
class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  ~OutputFiles();
  void add(const std::string& path, const uint8_t* bytes, size_t size);
  void add(const std::string& path, const std::vector<uint8_t>& bytes) { add(path, bytes.data(), bytes.size()); }
  void add_npy(const std::string& path, const Tensor& t);
  void commit();
  void discard();  // removes the temporaries now (the destructor's job, for a caller that tidies up after them)

 private:
  std::vector<std::pair<std::string, std::string>> staged_;  // (temporary, path)
};

// Writes `bytes` to `path` atomically (temp file in the same directory, fsync, rename, fsync dir): one OutputFiles.
// Throws InputError naming `path` on failure; no temp file is left behind.
void write_file_atomic(const std::string& path, const uint8_t* bytes, size_t size);
inline void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  write_file_atomic(path, bytes.data(), bytes.size());
}

// SHA-256 (FIPS 180-4) of a byte string, as 64 lowercase hex digits.
std::string sha256_hex(const uint8_t* bytes, size_t size);
inline std::string sha256_hex(const std::vector<uint8_t>& bytes) { return sha256_hex(bytes.data(), bytes.size()); }

}  // namespace fp8ref::io
