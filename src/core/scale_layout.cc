// fp8ref — scale layouts: the transforms between logical row-major scales and their stored forms
// (include/fp8ref/scale_layout.h states each layout and its source).
#include "fp8ref/scale_layout.h"

#include <cstring>
#include <string>

#include "fp8ref/error.h"

namespace fp8ref {

namespace {

struct Named {
  ScaleLayout value;
  const char* name;
};
constexpr Named kLayouts[] = {{ScaleLayout::row_major, "row-major"},
                              {ScaleLayout::col_major, "col-major"},
                              {ScaleLayout::tma_aligned, "tma-aligned"},
                              {ScaleLayout::packed_ue8m0, "packed-ue8m0"}};

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The [B, R, C] view of a logical scale shape (rank >= 2).
struct View {
  int64_t B = 1, R = 1, C = 1;
};
View view_of(const std::vector<int64_t>& logical) {
  View v;
  const size_t r = logical.size();
  v.R = logical[r - 2];
  v.C = logical[r - 1];
  for (size_t i = 0; i + 2 < r; ++i) v.B *= logical[i];
  return v;
}

// The E8M0 code of logical element i: the byte itself, or the exponent field of an f32-held ue8m0 scale.
uint8_t code_of(const uint8_t* p, size_t elem_bytes, int64_t i) {
  if (elem_bytes == 1) return p[i];
  uint32_t b;
  std::memcpy(&b, p + 4 * i, 4);
  return static_cast<uint8_t>((b >> 23) & 0xFF);
}

void put_code(uint8_t* p, size_t elem_bytes, int64_t i, uint8_t code) {
  if (elem_bytes == 1) {
    p[i] = code;
    return;
  }
  const uint32_t b = code == 0xFF ? 0x7FFFFFFFu : static_cast<uint32_t>(code) << 23;
  std::memcpy(p + 4 * i, &b, 4);
}

// Runs f(logical index, stored index) over every logical element (element-granular layouts).
template <typename F>
void each_element(ScaleLayout layout, const std::vector<int64_t>& logical, size_t align_bytes, F f) {
  if (layout == ScaleLayout::row_major || logical.size() < 2) {
    int64_t n = 1;
    for (int64_t d : logical) n *= d;
    for (int64_t i = 0; i < n; ++i) f(i, i);
    return;
  }
  const View v = view_of(logical);
  const int64_t Ra = layout == ScaleLayout::tma_aligned ? align_up(v.R, static_cast<int64_t>(16 / align_bytes)) : v.R;
  for (int64_t b = 0; b < v.B; ++b)
    for (int64_t r = 0; r < v.R; ++r)
      for (int64_t c = 0; c < v.C; ++c) f((b * v.R + r) * v.C + c, (b * v.C + c) * Ra + r);
}

}  // namespace

const char* to_string(ScaleLayout v) {
  for (const auto& e : kLayouts)
    if (e.value == v) return e.name;
  return "?";
}

bool parse_scale_layout(std::string_view s, ScaleLayout* out) {
  for (const auto& e : kLayouts)
    if (s == e.name) {
      *out = e.value;
      return true;
    }
  return false;
}

const char* scale_layout_names() { return "row-major, col-major, tma-aligned, packed-ue8m0"; }

int64_t StoredScaleShape::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StoredScaleShape stored_scale_shape(ScaleLayout layout, const std::vector<int64_t>& logical, size_t elem_bytes,
                                    bool is_ue8m0, size_t align_elem_bytes) {
  if (align_elem_bytes == 0) align_elem_bytes = elem_bytes;
  for (size_t b : {elem_bytes, align_elem_bytes})
    if (b != 1 && b != 2 && b != 4) throw InputError("scale-layout: scale elements of " + std::to_string(b) + " bytes");
  StoredScaleShape s;
  s.elem_bytes = elem_bytes;
  s.shape = logical;
  if (layout == ScaleLayout::row_major) return s;
  if (logical.size() < 2)
    throw InputError(std::string("scale-layout ") + to_string(layout) + " needs scales of rank >= 2 (data rank >= 2), got " +
                     shape_text(logical));
  if (layout == ScaleLayout::packed_ue8m0 && !is_ue8m0)
    throw InputError("scale-layout packed-ue8m0 packs E8M0 codes: it needs scale-dtype ue8m0");
  const size_t r = logical.size();
  const View v = view_of(logical);
  s.shape[r - 2] = v.C;
  s.shape[r - 1] = v.R;
  if (layout == ScaleLayout::tma_aligned) s.shape[r - 1] = align_up(v.R, static_cast<int64_t>(16 / align_elem_bytes));
  if (layout == ScaleLayout::packed_ue8m0) {
    s.shape[r - 2] = (v.C + 3) / 4;
    s.shape[r - 1] = align_up(v.R, 4);
    s.elem_bytes = 4;
    s.packed = true;
  }
  return s;
}

std::vector<uint8_t> to_scale_layout(ScaleLayout layout, const std::vector<int64_t>& logical, size_t elem_bytes,
                                     bool is_ue8m0, const void* logical_bytes, size_t align_elem_bytes) {
  if (align_elem_bytes == 0) align_elem_bytes = elem_bytes;
  const StoredScaleShape st = stored_scale_shape(layout, logical, elem_bytes, is_ue8m0, align_elem_bytes);
  std::vector<uint8_t> out(static_cast<size_t>(st.numel()) * st.elem_bytes, 0);
  const uint8_t* in = static_cast<const uint8_t*>(logical_bytes);
  if (st.packed) {
    const View v = view_of(logical);
    const int64_t P = st.shape[st.shape.size() - 2], Ra = st.shape.back();
    for (int64_t b = 0; b < v.B; ++b)
      for (int64_t r = 0; r < v.R; ++r)
        for (int64_t c = 0; c < v.C; ++c)
          out[static_cast<size_t>(((b * P + c / 4) * Ra + r) * 4 + c % 4)] =
              code_of(in, elem_bytes, (b * v.R + r) * v.C + c);
    return out;
  }
  each_element(layout, logical, align_elem_bytes, [&](int64_t li, int64_t si) {
    std::memcpy(out.data() + si * elem_bytes, in + li * elem_bytes, elem_bytes);
  });
  return out;
}

std::vector<uint8_t> from_scale_layout(ScaleLayout layout, const std::vector<int64_t>& logical, size_t elem_bytes,
                                       bool is_ue8m0, const void* stored_bytes, size_t align_elem_bytes) {
  if (align_elem_bytes == 0) align_elem_bytes = elem_bytes;
  const StoredScaleShape st = stored_scale_shape(layout, logical, elem_bytes, is_ue8m0, align_elem_bytes);
  int64_t n = 1;
  for (int64_t d : logical) n *= d;
  std::vector<uint8_t> out(static_cast<size_t>(n) * elem_bytes, 0);
  const uint8_t* in = static_cast<const uint8_t*>(stored_bytes);
  if (st.packed) {
    const View v = view_of(logical);
    const int64_t P = st.shape[st.shape.size() - 2], Ra = st.shape.back();
    for (int64_t b = 0; b < v.B; ++b)
      for (int64_t r = 0; r < v.R; ++r)
        for (int64_t c = 0; c < v.C; ++c)
          put_code(out.data(), elem_bytes, (b * v.R + r) * v.C + c,
                   in[static_cast<size_t>(((b * P + c / 4) * Ra + r) * 4 + c % 4)]);
    return out;
  }
  each_element(layout, logical, align_elem_bytes, [&](int64_t li, int64_t si) {
    std::memcpy(out.data() + li * elem_bytes, in + si * elem_bytes, elem_bytes);
  });
  return out;
}

}  // namespace fp8ref
