// fp8ref — the numerical diff: the text report and the JSON report.
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "diff/internal.h"
#include "fp8ref/diff.h"

namespace fp8ref::diff {

namespace {

using detail::hex_bits;
using detail::index_string;
using detail::num;
using detail::shape_string;

size_t bytes_of(const std::string& dtype) {
  if (auto d = io::parse_dtype(dtype)) return io::dtype_size(*d);
  return 1;
}

// Statistics (means, relative errors): 4 significant digits are enough.
std::string approx(double v) {
  if (!std::isfinite(v)) return num(v);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string pct(uint64_t a, uint64_t b) {
  char buf[32];
  const double p = b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 100.0;
  // never print 100% for "not all", nor 0% for "some"
  if (a != b && p > 99.999) std::snprintf(buf, sizeof buf, ">99.999%%");
  else if (a != 0 && p < 0.001) std::snprintf(buf, sizeof buf, "<0.001%%");
  else std::snprintf(buf, sizeof buf, "%.3f%%", p);
  return buf;
}

std::string range_list(const Breakdown& b) {
  std::string s;
  for (const auto& r : b.ranges) {
    if (!s.empty()) s += ",";
    s += std::to_string(r.first);
    if (r.second != r.first) s += "-" + std::to_string(r.second);
  }
  if (b.ranges_truncated) s += ",...";
  return s;
}

std::string unit_name(const Breakdown& b, uint64_t u, const StructureSection& st) {
  const int64_t gcols = (st.cols + 127) / 128;
  const auto U = static_cast<int64_t>(u);
  if (b.name == "row") return "row " + std::to_string(U);
  if (b.name == "group 1x128") {
    const int64_t r = U / gcols, c0 = (U % gcols) * 128;
    return "row " + std::to_string(r) + " cols " + std::to_string(c0) + "-" + std::to_string(std::min(st.cols, c0 + 128) - 1);
  }
  if (b.name == "block 128x128") {
    const int64_t r0 = (U / gcols) * 128, c0 = (U % gcols) * 128;
    return "rows " + std::to_string(r0) + "-" + std::to_string(std::min(st.rows, r0 + 128) - 1) + " cols " +
           std::to_string(c0) + "-" + std::to_string(std::min(st.cols, c0 + 128) - 1);
  }
  return std::to_string(U);
}

void line(std::string& out, const char* head, const std::string& text) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%-15s", head);
  out += buf + text + "\n";
}
const std::string kIndent(15, ' ');

void render_tensor(std::string& out, const TensorReport& r, const DiffReport& rep) {
  out += "== " + r.name + "  " + (r.format.empty() ? r.actual_dtype : r.format) + " " +
         shape_string(r.expected_shape.empty() ? r.actual_shape : r.expected_shape) + "  role " + r.role + "  contract " +
         r.contract + "  tol " + r.tol.to_string() + " ==\n";
  // 1. presence
  if (r.presence == TensorReport::Presence::ok)
    line(out, "1. presence", "ok: " + r.expected_dtype + " " + shape_string(r.expected_shape) + " in both" + r.presence_note);
  else
    line(out, "1. presence", r.presence_note);
  if (!r.compared) {
    out += "=> " + r.summary + "\n\n";
    return;
  }
  const size_t bytes = bytes_of(r.expected_dtype);
  // 2. scales
  const ScaleSection& s = r.scale;
  if (!s.present) {
    line(out, "2. scales", "none attached");
  } else if (s.is_scale) {
    line(out, "2. scales", "scale of " + s.tensor + ", block " + shape_string(s.block) + ": " +
                               std::to_string(s.blocks_differing) + " of " + std::to_string(s.blocks) +
                               " blocks differ (bitwise)");
    for (const ScaleBlockDiff& d : s.listed) {
      std::string cov;
      for (size_t k = 0; k < d.covers.size(); ++k)
        cov += (k ? ", " : "") + std::to_string(d.covers[k].first) + ":" + std::to_string(d.covers[k].second);
      std::string t = "block " + index_string(d.index) + (cov.empty() ? "" : " (" + s.tensor + "[" + cov + "])") + ": " +
                      num(d.expected) + " (" + hex_bits(d.expected_bits, bytes) + ") -> " + num(d.actual) + " (" +
                      hex_bits(d.actual_bits, bytes) + ")  " + detail::factor_string(d.factor, r.format == "ue8m0");
      int e2 = 0;
      const bool pow2 = std::isfinite(d.factor) && std::frexp(d.factor, &e2) == 0.5;
      if (d.other_block && !pow2) t += "  = expected scale of block " + index_string(d.other_index);
      out += kIndent + "  " + t + "\n";
    }
    if (s.blocks_differing > s.listed.size())
      out += kIndent + "  ... " + std::to_string(s.blocks_differing - s.listed.size()) + " more\n";
    if (!s.factors.empty()) {
      std::string f;
      for (const auto& [fac, n] : s.factors) f += (f.empty() ? "" : ", ") + detail::factor_string(fac, r.format == "ue8m0") + ": " + std::to_string(n);
      out += kIndent + "factors: " + f + "\n";
    }
    if (s.from_other_block >= 2 && 2 * s.from_other_block >= s.blocks_differing)
      out += kIndent + std::to_string(s.from_other_block) + " of " + std::to_string(s.blocks_differing) +
             " differing blocks carry another block's expected scale (scales read from the wrong block?)\n";
  } else {
    std::string t = s.tensor + " (block " + shape_string(s.block) + "): " + std::to_string(s.blocks_differing) + " of " +
                    std::to_string(s.blocks) + " blocks differ";
    if (s.blocks_differing)
      t += "; " + std::to_string(s.data_in_differing_blocks) + " elements in them, " + std::to_string(s.data_explained) +
           " mismatches explained by the scale (dequantized values agree)";
    line(out, "2. scales", t);
  }
  // 3. specials
  {
    const SpecialsSection& sp = r.specials;
    char buf[256];
    std::string hdr = "class    ";
    std::string e = "expected ", a = "actual   ";
    for (int i = 0; i < kNumValueClasses; ++i) {
      std::snprintf(buf, sizeof buf, " %10s", to_string(static_cast<ValueClass>(i)));
      hdr += buf;
      std::snprintf(buf, sizeof buf, " %10llu", static_cast<unsigned long long>(sp.expected[i]));
      e += buf;
      std::snprintf(buf, sizeof buf, " %10llu", static_cast<unsigned long long>(sp.actual[i]));
      a += buf;
    }
    line(out, "3. specials", hdr);
    out += kIndent + e + "\n" + kIndent + a + "\n";
    if (!sp.differ) {
      out += kIndent + "no element changed class\n";
    } else {
      out += kIndent + "confusion (expected -> actual), elements that changed class:\n";
      for (int i = 0; i < kNumValueClasses; ++i)
        for (int j = 0; j < kNumValueClasses; ++j)
          if (i != j && sp.confusion[i][j])
            out += kIndent + "  " + to_string(static_cast<ValueClass>(i)) + " -> " + to_string(static_cast<ValueClass>(j)) +
                   ": " + std::to_string(sp.confusion[i][j]) + "\n";
    }
  }
  // 4. metrics
  const MetricsSection& m = r.metrics;
  const uint64_t ndiff = m.numel - m.bitwise_equal;
  line(out, "4. metrics", "bitwise equal " + std::to_string(m.bitwise_equal) + " of " + std::to_string(m.numel) + " (" +
                              pct(m.bitwise_equal, m.numel) + ")");
  if (ndiff) {
    std::string h;
    for (const auto& [name, n] : m.ulp_histogram) h += (h.empty() ? "" : "  ") + name + ":" + std::to_string(n);
    out += kIndent + "ULP (" + r.format + "): max " + std::to_string(m.max_ulp) + "; histogram " + h + "\n";
    if (ndiff > m.no_distance) {
      out += kIndent + "abs error: max " + num(m.max_abs) + " at flat " + std::to_string(m.max_abs_flat) + ", mean " +
             approx(m.mean_abs) + " (over " + std::to_string(m.finite_pairs) + " finite pairs)\n";
      out += kIndent + "rel error: max " + approx(m.max_rel) + " at flat " + std::to_string(m.max_rel_flat) + ", mean " +
             approx(m.mean_rel) + " (over " + std::to_string(m.rel_pairs) + " pairs with expected != 0)" +
             (m.rel_undefined ? "; " + std::to_string(m.rel_undefined) + " nonzero where expected is 0" : "") + "\n";
    }
    if (!m.worst.empty()) {
      out += kIndent + "worst " + std::to_string(m.worst.size()) + " of " + std::to_string(ndiff) + " differing:\n";
      char buf[320];
      std::snprintf(buf, sizeof buf, "  %-16s %-26s %-26s %-20s %6s %-10s %-10s %s", "index", "expected", "actual",
                    m.worst.front().exact ? "exact" : "", "ULP", "abs", "rel", "class");
      out += kIndent + buf + "\n";
      for (const WorstElement& w : m.worst) {
        const std::string ev = hex_bits(w.expected_bits, bytes) + " " + num(w.expected);
        const std::string av = hex_bits(w.actual_bits, bytes) + " " + num(w.actual);
        std::snprintf(buf, sizeof buf, "  %-16s %-26s %-26s %-20s %6s %-10s %-10s %s", index_string(w.index).c_str(),
                      ev.c_str(), av.c_str(), w.exact ? num(*w.exact).c_str() : "",
                      w.ulp ? std::to_string(*w.ulp).c_str() : "n/a", num(w.abs_err).c_str(), approx(w.rel_err).c_str(),
                      to_string(w.cls));
        out += kIndent + buf + "\n";
      }
    }
  }
  // 5. structure
  const StructureSection& st = r.structure;
  if (!ndiff) {
    line(out, "5. structure", "no mismatches");
  } else {
    line(out, "5. structure", "2-D view " + std::to_string(st.rows) + " rows x " + std::to_string(st.cols) +
                                  " cols (leading dimensions flattened into rows)");
    for (const Breakdown& b : st.breakdowns) {
      std::string t = b.name + ": " + std::to_string(b.units_with_mismatch) + " of " + std::to_string(b.units) + " with mismatches";
      if (b.name.rfind("dim ", 0) == 0) {
        t += ": " + range_list(b);
      } else {
        std::string top;
        for (const auto& [u, n] : b.top) top += (top.empty() ? "" : "; ") + unit_name(b, u, st) + " (" + std::to_string(n) + ")";
        t += "; most: " + top;
      }
      out += kIndent + t + "\n";
    }
    out += kIndent + "heatmap (" + st.cell + "; '.' none, 1-9 tenths mismatching, '#' all):\n";
    for (const std::string& h : st.heatmap) out += kIndent + "  |" + h + "|\n";
    for (const std::string& n : st.notes) out += kIndent + "note: " + n + "\n";
  }
  // 6. classes
  {
    const ClassSection& c = r.classes;
    std::string t;
    for (int i = 0; i < kNumMismatchClasses; ++i)
      if (c.counts[i]) t += (t.empty() ? "" : ", ") + std::string(to_string(static_cast<Mismatch>(i))) + " " + std::to_string(c.counts[i]);
    if (t.empty()) t = "none";
    t += std::string("  (exact values ") + (c.exact_available ? "present" : "absent: tie and double rounding not tested") +
         (c.bound_available ? "; bound present" : "") + ")";
    line(out, "6. classes", t);
    for (const std::string& e : c.scale_block_examples) out += kIndent + "  off by a common factor: " + e + "\n";
    if (c.scale_blocks > c.scale_block_examples.size())
      out += kIndent + "  ... " + std::to_string(c.scale_blocks - c.scale_block_examples.size()) + " more blocks\n";
  }
  // 7. tolerance
  {
    std::string t = "smallest passing: " + r.min_tolerance;
    if (!r.min_tolerance_alternatives.empty()) {
      t += " (or ";
      for (size_t i = 0; i < r.min_tolerance_alternatives.size(); ++i) t += (i ? " | " : "") + r.min_tolerance_alternatives[i];
      t += ")";
    }
    t += "; under " + r.tol.to_string() + ": " + (r.tol_pass ? "pass" : "FAIL");
    if (!r.tol_pass && r.tol_violations)
      t += " (" + std::to_string(r.tol_violations) + (r.tol_violations == 1 ? " element violates" : " elements violate") + " it)";
    line(out, "7. tolerance", t);
    if (!r.tol_note.empty()) out += kIndent + "note: " + r.tol_note + "\n";
  }
  // 8. trust
  line(out, "8. trust", (r.mistrusted ? "MISTRUSTED: " : "ok: ") + r.trust_note);
  out += "=> " + r.summary + "\n\n";
  (void)rep;
}

nlohmann::json jnum(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// "distance to each model" (fp8ref diff --models): one line per model, best first.
void render_models(std::string& out, const DiffReport& rep) {
  if (rep.models.empty()) {
    if (!rep.models_note.empty()) out += "models: " + rep.models_note + "\n";
    return;
  }
  out += "distance of " + rep.actual_name + " to each model (EXPECTED's inputs run by the cpu backend):\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-46s %11s %9s %9s\n", "model", "bit-equal", "max ulp", "specials");
  out += line;
  std::string not_run, first_reason;
  for (const ModelDistance& m : rep.models) {
    const std::string name = m.name + (m.is_reference ? " (EXPECTED's)" : "");
    if (!m.skipped.empty()) {  // listed together below: models that do not apply to this case
      not_run += (not_run.empty() ? "" : ", ") + name;
      if (first_reason.empty()) first_reason = name + ": " + m.skipped.substr(0, 160);
      continue;
    } else {
      const double f = m.elements ? 100.0 * static_cast<double>(m.equal) / static_cast<double>(m.elements) : 100.0;
      std::snprintf(line, sizeof line, "  %-46s %10.4f%% %9llu %9llu\n", name.c_str(), f,
                    static_cast<unsigned long long>(m.max_ulp), static_cast<unsigned long long>(m.special_mismatch));
    }
    out += line;
    if (!m.note.empty()) out += "      (" + m.note + ")\n";
  }
  if (!not_run.empty()) out += "  not run (not defined for this case): " + not_run + "\n    (" + first_reason + ")\n";
  const ModelDistance& best = rep.models.front();
  auto exact = [](const ModelDistance& m) { return m.skipped.empty() && m.elements && m.equal == m.elements; };
  if (exact(best)) {
    std::string also;
    for (size_t i = 1; i < rep.models.size() && exact(rep.models[i]); ++i)
      also += (also.empty() ? "" : ", ") + rep.models[i].name;
    out += "  => bit-exact under " + best.name + ": fp8ref golden --case '" + best.descriptor + "'\n";
    if (!also.empty()) out += "     (the same output on this case: " + also + ")\n";
  } else
    out += "  => no model reproduces " + rep.actual_name + " bit for bit\n";
  if (!rep.models_note.empty()) out += "  (" + rep.models_note + ")\n";
}

}  // namespace

std::string render_text(const DiffReport& rep, bool quiet) {
  std::string out;
  if (!quiet) {
    out += "fp8ref diff\n";
    out += "  expected: " + rep.expected_name + (rep.expected_backend.empty() ? "" : " (backend " + rep.expected_backend + ")") + "\n";
    out += "  actual:   " + rep.actual_name + (rep.actual_backend.empty() ? "" : " (backend " + rep.actual_backend + ")") + "\n";
    if (!rep.descriptor.empty()) out += "  case:     " + rep.descriptor + "\n";
    out += "\n";
    for (const TensorReport& r : rep.tensors) render_tensor(out, r, rep);
    out += "summary:\n";
  }
  for (const TensorReport& r : rep.tensors) out += "  " + r.summary + "\n";
  render_models(out, rep);
  out += std::string("verdict: ") + to_string(rep.verdict) + "\n";
  if (rep.verdict == Verdict::fail)
    out += "repro: " + (rep.repro.empty() ? std::string("(") + rep.expected_name + " has no fp8ref.descriptor)" : rep.repro) + "\n";
  return out;
}

std::string render_json(const DiffReport& rep) {
  using nlohmann::json;
  json j;
  j["expected"] = rep.expected_name;
  j["actual"] = rep.actual_name;
  j["descriptor"] = rep.descriptor;
  j["repro"] = rep.repro;
  j["expected_backend"] = rep.expected_backend;
  j["actual_backend"] = rep.actual_backend;
  j["verdict"] = to_string(rep.verdict);
  j["exit_code"] = rep.exit_code();
  if (!rep.models.empty() || !rep.models_note.empty()) {
    json ms = json::array();
    for (const ModelDistance& m : rep.models)
      ms.push_back({{"name", m.name},
                    {"descriptor", m.descriptor},
                    {"ran", m.skipped.empty()},
                    {"skipped", m.skipped},
                    {"elements", m.elements},
                    {"bit_equal", m.equal},
                    {"max_ulp", m.max_ulp},
                    {"special_mismatch", m.special_mismatch},
                    {"is_expected_model", m.is_reference},
                    {"note", m.note}});
    j["models"] = ms;
    j["models_note"] = rep.models_note;
  }
  j["tensors"] = json::array();
  static const char* const kPresence[] = {"ok", "missing", "extra", "dtype_mismatch", "shape_mismatch", "transposed"};
  for (const TensorReport& r : rep.tensors) {
    json t;
    t["name"] = r.name;
    t["role"] = r.role;
    t["format"] = r.format;
    t["contract"] = r.contract;
    t["dims"] = r.dims;
    t["verdict"] = to_string(r.verdict);
    t["summary"] = r.summary;
    t["presence"] = {{"status", kPresence[static_cast<int>(r.presence)]},
                     {"note", r.presence_note},
                     {"expected_dtype", r.expected_dtype},
                     {"actual_dtype", r.actual_dtype},
                     {"expected_shape", r.expected_shape},
                     {"actual_shape", r.actual_shape}};
    t["compared"] = r.compared;
    t["tolerance"] = {{"tol", r.tol.to_string()},
                      {"pass", r.tol_pass},
                      {"violations", r.tol_violations},
                      {"note", r.tol_note},
                      {"min", r.min_tolerance},
                      {"min_alternatives", r.min_tolerance_alternatives}};
    t["trust"] = {{"mistrusted", r.mistrusted}, {"note", r.trust_note}};
    if (r.compared) {
      const size_t bytes = bytes_of(r.expected_dtype);
      const ScaleSection& s = r.scale;
      json sj = {{"present", s.present}, {"is_scale", s.is_scale}, {"tensor", s.tensor}, {"block", s.block},
                 {"blocks", s.blocks}, {"blocks_differing", s.blocks_differing}, {"from_other_block", s.from_other_block},
                 {"data_in_differing_blocks", s.data_in_differing_blocks}, {"data_explained", s.data_explained}};
      sj["listed"] = json::array();
      for (const ScaleBlockDiff& d : s.listed) {
        json dj = {{"flat", d.flat}, {"other_index", d.other_index}, {"index", d.index}, {"expected_bits", hex_bits(d.expected_bits, bytes)},
                   {"actual_bits", hex_bits(d.actual_bits, bytes)}, {"expected", jnum(d.expected)},
                   {"actual", jnum(d.actual)}, {"factor", jnum(d.factor)}, {"factor_text", detail::factor_string(d.factor, r.format == "ue8m0")}};
        json cov = json::array();
        for (const auto& c : d.covers) cov.push_back({c.first, c.second});
        dj["covers"] = cov;
        dj["other_block"] = d.other_block ? json(*d.other_block) : json(nullptr);
        sj["listed"].push_back(dj);
      }
      sj["factors"] = json::array();
      for (const auto& [f, n] : s.factors) sj["factors"].push_back({{"factor", jnum(f)}, {"text", detail::factor_string(f, r.format == "ue8m0")}, {"blocks", n}});
      t["scale"] = sj;

      const SpecialsSection& sp = r.specials;
      json spj;
      spj["classes"] = json::array();
      json e = json::object(), a = json::object(), conf = json::array();
      for (int i = 0; i < kNumValueClasses; ++i) {
        const char* n = to_string(static_cast<ValueClass>(i));
        spj["classes"].push_back(n);
        e[n] = sp.expected[i];
        a[n] = sp.actual[i];
        json row = json::array();
        for (int k = 0; k < kNumValueClasses; ++k) row.push_back(sp.confusion[i][k]);
        conf.push_back(row);
      }
      spj["expected"] = e;
      spj["actual"] = a;
      spj["confusion"] = conf;
      spj["differ"] = sp.differ;
      t["specials"] = spj;

      const MetricsSection& m = r.metrics;
      json mj = {{"numel", m.numel}, {"bitwise_equal", m.bitwise_equal},
                 {"bitwise_equal_fraction", m.numel ? static_cast<double>(m.bitwise_equal) / static_cast<double>(m.numel) : 1.0},
                 {"no_distance", m.no_distance}, {"incompatible", m.incompatible}, {"max_ulp", m.max_ulp},
                 {"finite_pairs", m.finite_pairs}, {"max_abs", jnum(m.max_abs)}, {"max_abs_flat", m.max_abs_flat},
                 {"mean_abs", jnum(m.mean_abs)}, {"rel_pairs", m.rel_pairs}, {"max_rel", jnum(m.max_rel)},
                 {"max_rel_flat", m.max_rel_flat}, {"mean_rel", jnum(m.mean_rel)}, {"rel_undefined", m.rel_undefined}};
      json hist = json::object();
      for (const auto& [name, n] : m.ulp_histogram) hist[name] = n;
      mj["ulp_histogram"] = hist;
      mj["worst"] = json::array();
      for (const WorstElement& w : m.worst) {
        json wj = {{"flat", w.flat}, {"index", w.index}, {"expected_bits", hex_bits(w.expected_bits, bytes)},
                   {"actual_bits", hex_bits(w.actual_bits, bytes)}, {"expected", jnum(w.expected)},
                   {"actual", jnum(w.actual)}, {"abs_err", jnum(w.abs_err)}, {"rel_err", jnum(w.rel_err)},
                   {"class", to_string(w.cls)}};
        wj["exact"] = w.exact ? jnum(*w.exact) : json(nullptr);
        wj["ulp"] = w.ulp ? json(*w.ulp) : json(nullptr);
        mj["worst"].push_back(wj);
      }
      t["metrics"] = mj;

      const StructureSection& st = r.structure;
      json stj = {{"rows", st.rows}, {"cols", st.cols}, {"heatmap", st.heatmap}, {"heatmap_cell", st.cell}, {"notes", st.notes}};
      stj["breakdowns"] = json::array();
      for (const Breakdown& b : st.breakdowns) {
        json bj = {{"name", b.name}, {"units", b.units}, {"units_with_mismatch", b.units_with_mismatch},
                   {"unit_elements", b.unit_elements}, {"ranges_truncated", b.ranges_truncated}};
        json top = json::array(), ranges = json::array();
        for (const auto& [u, n] : b.top) top.push_back({{"unit", u}, {"name", unit_name(b, u, st)}, {"mismatches", n}});
        for (const auto& rg : b.ranges) ranges.push_back({rg.first, rg.second});
        bj["top"] = top;
        bj["ranges"] = ranges;
        stj["breakdowns"].push_back(bj);
      }
      t["structure"] = stj;

      const ClassSection& c = r.classes;
      json cj = json::object();
      for (int i = 0; i < kNumMismatchClasses; ++i) cj[to_string(static_cast<Mismatch>(i))] = c.counts[i];
      t["classes"] = {{"counts", cj}, {"exact_available", c.exact_available}, {"bound_available", c.bound_available},
                      {"scale_blocks", c.scale_blocks}, {"scale_block_examples", c.scale_block_examples}};
    }
    j["tensors"].push_back(t);
  }
  return j.dump(2) + "\n";
}

}  // namespace fp8ref::diff
