// fp8ref diff — scale tensors stored in a layout (fp8ref.outputs "layout": col-major, tma-aligned, packed-ue8m0;
// include/fp8ref/scale_layout.h) are read back to their logical row-major form before the diff, so that blocks,
// worst elements and the data tensor's attached scales are named in logical coordinates.
#pragma once

#include <list>
#include <map>
#include <string>
#include <vector>

#include "fp8ref/io.h"

namespace fp8ref::diff::detail {

struct LogicalViews {
  std::list<io::Tensor> owned;                   // the converted tensors (the views below point into them)
  std::vector<io::TensorView> expected, actual;  // the files' tensors, laid-out scale tensors in logical form
  std::map<std::string, std::string> expected_metadata;  // emd, or a copy whose fp8ref.outputs is adjusted (below)
  // tensor name -> how it is stored ("packed-ue8m0 I32 [1, 32]"), for each tensor compared in logical form
  std::map<std::string, std::string> stored_as;
};

// `emd`: the EXPECTED file's metadata (its fp8ref.outputs says which tensors are laid out, their element format and
// logical shape). A laid-out tensor is converted in both files when both hold it in its stored dtype and shape. An
// ACTUAL tensor of another dtype/shape leaves both as stored and the tensor is diffed as plain data (role "data" in
// the returned metadata), so the diff reports the shape/dtype mismatch against the stored form: a logical row-major
// tensor where the golden file has tma-aligned scales is a layout error, not a pass. A malformed EXPECTED tensor or
// layout entry: InputError naming `expected_name`.
LogicalViews logical_scale_views(const std::vector<io::TensorView>& expected, const std::vector<io::TensorView>& actual,
                                 const std::map<std::string, std::string>& emd, const std::string& expected_name);

}  // namespace fp8ref::diff::detail
