// fp8ref command line — the SCALES file (scales_file.h).
#include "scales_file.h"

#include <cstring>

#include "fp8ref/format.h"

namespace fp8ref::cli {

io::Tensor scales_file(const QuantSpec& spec, bool codes, const std::vector<uint8_t>& storage,
                       const std::vector<int64_t>& shape) {
  const Format st = scale_storage(spec);
  io::Tensor t = io::make_tensor("", codes ? io::DType::U8 : io::DType::F32, shape);
  const size_t n = static_cast<size_t>(t.numel());
  for (size_t i = 0; i < n; ++i) {
    if (codes) {
      if (st == Format::ue8m0) {
        t.data[i] = storage[i];
      } else {  // ue8m0 held as f32: the exponent field (0.0 -> 0; Inf, NaN -> 255)
        uint32_t b;
        std::memcpy(&b, &storage[4 * i], 4);
        t.data[i] = static_cast<uint8_t>((b >> 23) & 0xFF);
      }
      continue;
    }
    const float v = ref::scale_value(spec, storage.data(), i);
    std::memcpy(&t.data[4 * i], &v, 4);
  }
  return t;
}

io::Tensor stored_scales_file(const QuantSpec& spec, bool codes, const std::vector<uint8_t>& storage, const QuantLayout& L) {
  const StoredScaleShape stored = stored_scales(spec, L);
  if (stored.packed) {
    io::Tensor t = io::make_tensor("", io::DType::I32, stored.shape);
    t.data = layout_scales(spec, L, storage.data());
    return t;
  }
  io::Tensor t = scales_file(spec, codes, storage, L.scale_shape);
  if (spec.scale_layout == ScaleLayout::row_major) return t;
  io::Tensor out = io::make_tensor("", t.dtype, stored.shape);
  out.data = to_scale_layout(spec.scale_layout, L.scale_shape, io::dtype_size(t.dtype),
                             spec.scale_dtype == ScaleDtype::ue8m0, t.data.data(),
                             static_cast<size_t>(format_info(scale_storage(spec)).bits / 8));
  return out;
}

}  // namespace fp8ref::cli
