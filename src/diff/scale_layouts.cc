// fp8ref diff — laid-out scale tensors back to logical row-major form (src/diff/scale_layouts.h).
#include "diff/scale_layouts.h"

#include <nlohmann/json.hpp>

#include "fp8ref/error.h"
#include "fp8ref/format.h"
#include "fp8ref/scale_layout.h"

namespace fp8ref::diff::detail {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

LogicalViews logical_scale_views(const std::vector<io::TensorView>& expected, const std::vector<io::TensorView>& actual,
                                 const std::map<std::string, std::string>& emd, const std::string& expected_name) {
  LogicalViews out;
  out.expected = expected;
  out.actual = actual;
  out.expected_metadata = emd;
  auto it = emd.find("fp8ref.outputs");
  if (it == emd.end()) return out;
  nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;  // the diff's own parser reports malformed metadata
  auto bad = [&](const std::string& name, const std::string& why) {
    return InputError(expected_name + ": metadata 'fp8ref.outputs': tensor '" + name + "': " + why);
  };
  bool adjusted = false;
  auto find = [](std::vector<io::TensorView>& v, const std::string& name) -> io::TensorView* {
    for (io::TensorView& t : v)
      if (t.name == name) return &t;
    return nullptr;
  };
  const nlohmann::json entries = j;
  for (auto& item : entries.items()) {
    const nlohmann::json& o = item.value();
    if (!o.is_object() || !o.contains("layout")) continue;
    const std::string name = item.key();
    if (!o["layout"].is_string()) throw bad(name, "'layout' is not a string");
    ScaleLayout layout;
    if (!parse_scale_layout(o["layout"].get<std::string>(), &layout))
      throw bad(name, "unknown layout '" + o["layout"].get<std::string>() + "' (" + scale_layout_names() + ")");
    if (layout == ScaleLayout::row_major) continue;
    std::vector<int64_t> logical;
    if (!o.contains("logical_shape") || !o["logical_shape"].is_array()) throw bad(name, "a layout needs 'logical_shape'");
    for (auto& d : o["logical_shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad(name, "'logical_shape' entries must be integers >= 0");
      logical.push_back(d.get<int64_t>());
    }
    Format fmt;
    if (!o.contains("format") || !o["format"].is_string() || !parse_format(o["format"].get<std::string>(), &fmt))
      throw bad(name, "a laid-out scale tensor needs its element 'format'");
    const bool ue8m0 = fmt == Format::ue8m0 || layout == ScaleLayout::packed_ue8m0;
    const size_t eb = static_cast<size_t>(format_info(fmt).bits / 8);
    StoredScaleShape st;
    try {
      st = stored_scale_shape(layout, logical, eb, ue8m0);
    } catch (const InputError& e) {
      throw bad(name, e.what());
    }
    const io::DType stored_dtype = st.packed ? io::DType::I32 : io::format_dtype(fmt);
    io::TensorView* e = find(out.expected, name);
    if (!e) continue;  // the diff reports what is missing
    if (e->dtype != stored_dtype || e->shape != st.shape)
      throw bad(name, "stored as " + std::string(io::dtype_name(e->dtype)) + " " + shape_text(e->shape) + ", but layout " +
                          to_string(layout) + " of logical " + shape_text(logical) + " is " +
                          io::dtype_name(stored_dtype) + " " + shape_text(st.shape));
    io::TensorView* a = find(out.actual, name);
    if (a && (a->dtype != stored_dtype || a->shape != st.shape)) {  // diffed as stored, as plain data
      j[name]["role"] = "data";
      j[name].erase("of");
      j[name].erase("block");
      adjusted = true;
      continue;
    }
    out.stored_as[name] = std::string(to_string(layout)) + " " + io::dtype_name(stored_dtype) + " " + shape_text(st.shape);
    for (io::TensorView* v : {e, a}) {
      if (!v) continue;
      io::Tensor t = io::make_tensor(v->name, io::format_dtype(fmt), logical);
      t.data = from_scale_layout(layout, logical, eb, ue8m0, v->bytes);
      out.owned.push_back(std::move(t));
      *v = io::view_of(out.owned.back());
    }
  }
  if (adjusted) out.expected_metadata["fp8ref.outputs"] = j.dump();
  return out;
}

}  // namespace fp8ref::diff::detail
