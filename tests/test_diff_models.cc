// fp8ref diff --models (golden::model_distances): a device output made under one model is recognised as that
// model, bit for bit, among every model of its op; the golden model itself is flagged; ops without models say so.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "fp8ref/diff.h"
#include "fp8ref/golden.h"
#include "fp8ref/io.h"

using namespace fp8ref;

namespace {

struct Files {
  std::filesystem::path dir;
  std::string expected, actual;
  Files(const io::SafetensorsFile& e, const io::SafetensorsFile& a, const char* tag) {
    dir = std::filesystem::temp_directory_path() / ("fp8ref_models_" + std::string(tag) + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    expected = (dir / "e.safetensors").string();
    actual = (dir / "a.safetensors").string();
    io::write_safetensors(expected, e.tensors, e.metadata);
    io::write_safetensors(actual, a.tensors, a.metadata);
  }
  ~Files() { std::filesystem::remove_all(dir); }
};

// The result file of `backend` on the case `desc` (as a device would hand it over).
io::SafetensorsFile result_of(const std::string& desc) {
  return golden::run_case(golden::make_golden(golden::parse_descriptor(desc)), "cpu", desc);
}

}  // namespace

TEST_CASE("diff --models: a device output of a non-default model is found among the scaled_mm models") {
  const std::string base = "scaled_mm shape=48x160x1024 scaling=rowwise model=exact out=bf16 seed=3";
  struct Want {
    const char* desc;
    const char* name;
  };
  for (const Want& w : {Want{"scaled_mm shape=48x160x1024 scaling=rowwise model=hopper-tc promote=never split-k=2 out=bf16 seed=3",
                             "hopper-tc --promote never --split-k 2"},
                        Want{"scaled_mm shape=48x160x1024 scaling=rowwise model=hopper-tc out=bf16 seed=3",
                             "hopper-tc --promote 128 --split-k 1"},
                        Want{"scaled_mm shape=48x160x1024 scaling=rowwise model=exact out=bf16 seed=3", "exact"}}) {
    CAPTURE(w.desc);
    const io::SafetensorsFile g = golden::make_golden(golden::parse_descriptor(base));
    Files f(g, result_of(w.desc), "mm");
    const io::MappedSafetensors em(f.expected), am(f.actual);
    std::string note;
    const std::vector<diff::ModelDistance> rows = golden::model_distances(em, am, &note);
    REQUIRE(rows.size() == 14);  // exact, f32-kblock x2, hopper-tc 2 x 5, mma-sync-sm90
    CHECK(note.empty());
    CHECK(rows[0].name == w.name);
    CHECK(rows[0].skipped.empty());
    CHECK(rows[0].elements == 48 * 160);
    CHECK(rows[0].equal == rows[0].elements);
    CHECK(rows[0].max_ulp == 0);
    int refs = 0;
    for (const diff::ModelDistance& m : rows) {
      refs += m.is_reference;
      if (m.is_reference) CHECK(m.name == "exact");
      if (m.name != w.name && m.skipped.empty() && std::string(w.name) != "exact" && m.name == "exact")
        CHECK(m.equal < m.elements);  // K = 1024: the hopper-tc truncation shows in some outputs
    }
    CHECK(refs == 1);
    // The report carries the table in text and JSON.
    diff::DiffReport rep = diff::diff_files(em, am);
    rep.models = rows;
    const std::string text = diff::render_text(rep);
    CHECK(text.find(std::string("=> bit-exact under ") + w.name) != std::string::npos);
    CHECK(diff::render_json(rep).find("\"models\"") != std::string::npos);
  }
}

TEST_CASE("diff --models: a corrupted output matches no model; ops without models say why") {
  const std::string desc = "scaled_mm shape=32x64x256 scaling=blockwise model=f32-kblock out=f32 seed=5";
  io::SafetensorsFile a = result_of(desc);
  for (io::Tensor& t : a.tensors)
    if (t.name == "output.out") t.data[40] ^= 0x01;  // one element off by one ULP
  Files f(golden::make_golden(golden::parse_descriptor(desc)), a, "bad");
  const io::MappedSafetensors em(f.expected), am(f.actual);
  std::string note;
  const auto rows = golden::model_distances(em, am, &note);
  REQUIRE(!rows.empty());
  CHECK(rows[0].equal + 1 == rows[0].elements);
  CHECK(rows[0].max_ulp == 1);
  diff::DiffReport rep = diff::diff_files(em, am);
  rep.models = rows;
  CHECK(diff::render_text(rep).find("=> no model reproduces") != std::string::npos);
  // blockwise scales with promote never are refused (as torch does): listed as not run, after the models that ran
  bool skipped = false;
  for (const auto& m : rows)
    if (m.name.find("--promote never") != std::string::npos) skipped = skipped || !m.skipped.empty();
  CHECK(skipped);
  CHECK(rows.back().skipped.size() > 0);

  const std::string ddesc = "dequantize from=e4m3fn shape=64x512 granularity=group:128";
  Files c(golden::make_golden(golden::parse_descriptor(ddesc)), result_of(ddesc), "deq");
  const io::MappedSafetensors ce(c.expected), ca(c.actual);
  CHECK(golden::model_distances(ce, ca, &note).empty());
  CHECK(note.find("no alternative models") != std::string::npos);
}

TEST_CASE("diff --models: a conversion that truncates is found as the convention under rounding=rz") {
  const std::string base = "convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 seed=3";
  Files f(golden::make_golden(golden::parse_descriptor(base)), result_of(base + " rounding=rz"), "rz");
  const io::MappedSafetensors em(f.expected), am(f.actual);
  std::string note;
  const auto rows = golden::model_distances(em, am, &note);
  REQUIRE(rows.size() > 5);
  CHECK(rows[0].name == "torch-2.11 rounding=rz");
  CHECK(rows[0].equal == rows[0].elements);
  CHECK(rows[1].equal < rows[1].elements);  // nothing else reproduces it
  bool golden_listed = false;
  for (const auto& m : rows) golden_listed = golden_listed || (m.is_reference && m.name == "torch-2.11");
  CHECK(golden_listed);
}

TEST_CASE("diff --models: paged attention and cache-write outputs are matched to their convention") {
  for (const char* conv : {"flashinfer", "vllm-triton-unified", "torch-sdpa-math"}) {
    CAPTURE(conv);
    const std::string base = "paged_attention convention=exact seed=5";
    const std::string dev = std::string("paged_attention convention=") + conv + " seed=5";
    Files f(golden::make_golden(golden::parse_descriptor(base)), result_of(dev), "attn");
    const io::MappedSafetensors em(f.expected), am(f.actual);
    std::string note;
    const auto rows = golden::model_distances(em, am, &note);
    // six conventions, vLLM's Triton kernels forced three ways, FlashInfer's decode split two, its prefill rows on the
    // decode kernel's steps, its prefill kernel unsplit
    REQUIRE(rows.size() == 13);
    CHECK(rows[0].equal == rows[0].elements);
    bool found = false;
    for (const auto& m : rows) {
      found = found || (m.name == conv && m.equal == m.elements);
      if (m.is_reference) CHECK(m.equal < m.elements);  // exact differs from the device's convention somewhere
    }
    CHECK(found);
  }
  // A decode-only batch a device ran under another launch than the golden's: that launch is named first, and neither
  // the golden's own model nor `other` reproduces the device; `more` checks the rows further.
  using Rows = std::vector<diff::ModelDistance>;
  auto named = [](const std::string& gold, const std::string& device, const char* tag, const char* first,
                  const char* other, const std::function<void(const io::MappedSafetensors&, const io::MappedSafetensors&,
                                                              const Rows&)>& more) {
    Files f(golden::make_golden(golden::parse_descriptor(gold)), result_of(device), tag);
    const io::MappedSafetensors em(f.expected), am(f.actual);
    std::string note;
    const Rows rows = golden::model_distances(em, am, &note);
    REQUIRE(rows.size() == 13);
    CHECK(rows[0].name == first);
    CHECK(rows[0].equal == rows[0].elements);
    for (const auto& m : rows)
      if (m.is_reference || m.name == other) CHECK(m.equal < m.elements);
    more(em, am, rows);
  };
  // FlashInfer splits this batch (chunks of 128 keys on H100/H200); the device ran one pass
  named("paged_attention convention=flashinfer seq-lens=600,40,300 q-lens=1,1,1 seed=8",
        "paged_attention convention=flashinfer kv-chunk=0 seq-lens=600,40,300 q-lens=1,1,1 seed=8", "fi1pass",
        "flashinfer kv-chunk=0", "flashinfer kv-chunk=128", [](const auto&, const auto&, const Rows&) {});
  // prefill chunks: the golden model runs FlashInfer's tensor-core prefill kernel; the device took its decode kernel's
  // steps for them
  named("paged_attention convention=flashinfer seq-lens=200,40,90 q-lens=5,1,9 seed=9",
        "paged_attention convention=flashinfer fi-kernel=decode seq-lens=200,40,90 q-lens=5,1,9 seed=9", "fidec",
        "flashinfer fi-kernel=decode", "flashinfer", [](const auto&, const auto&, const Rows&) {});
  // the golden model runs vLLM's 3D kernel; the device ran the 2D kernel
  named("paged_attention convention=vllm-triton-unified seq-lens=600,40,3 q-lens=1,1,1 seed=7",
        "paged_attention convention=vllm-triton-unified segments=0 seq-lens=600,40,3 q-lens=1,1,1 seed=7", "attn2d",
        "vllm-triton-unified segments=0", "vllm-triton-unified segments=16",
        [](const io::MappedSafetensors& em, const io::MappedSafetensors& am, const Rows& rows) {
          for (const auto& m : rows)
            if (m.is_reference) {  // the same pair as the diff's own report: the same largest distance (±0 one point)
              const diff::DiffReport rep = diff::diff_files(em, am);
              REQUIRE(rep.tensors.size() == 1);
              CHECK(rep.tensors[0].metrics.max_ulp == m.max_ulp);
            }
        });
  const std::string base = "kv_cache_write convention=exact seed=60";
  Files f(golden::make_golden(golden::parse_descriptor(base)), result_of("kv_cache_write convention=vllm-cuda seed=60"), "kv");
  const io::MappedSafetensors em(f.expected), am(f.actual);
  std::string note;
  const auto rows = golden::model_distances(em, am, &note);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].equal == rows[0].elements);
  bool found = false;
  for (const auto& m : rows) found = found || (m.name == "vllm-cuda" && m.equal == m.elements);
  CHECK(found);
}
