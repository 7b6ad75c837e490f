// fp8ref kv-cache-write / paged-attention — the paged-attention ops on .npy files (include/fp8ref/attention.h).
//
// Every file, shape, index and option is validated before anything is written; outputs are written atomically. On
// bad input nothing is written and the exit code is 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/attention.h"
#include "fp8ref/error.h"
#include "fp8ref/format.h"
#include "fp8ref/io.h"

namespace fp8ref::cli {
namespace {

const char* kWriteHelp =
    "Usage: fp8ref kv-cache-write --convention C --model F --k K.npy --v V.npy --slot-mapping S.npy\n"
    "                             --k-cache KC.npy --v-cache VC.npy --out-k-cache OK.npy --out-v-cache OV.npy\n"
    "                             [--k-scale KS.npy --v-scale VS.npy | --dynamic --out-k-scale F --out-v-scale F]\n"
    "                             [--cache-format e4m3fn|e5m2] [--layout nhd|hnd] [--scale-kind tensor|head|seq]\n"
    "                             [--query-start-loc QSL.npy] [--backend cpu|reference]\n"
    "\n"
    "Quantizes K and V [T, Hkv, D] into copies of the given FP8 caches at slot_mapping[t] (-1: skip the token),\n"
    "block = slot / block_size, offset = slot % block_size, as the named stack does:\n"
    "  vllm-cuda   satfinite_RNE(f32(x) / s)                 (vLLM reshape_and_cache_flash)\n"
    "  sglang      torch cast of RN_md(f32(x) / s)            (x / s in the model dtype, then .to(fp8): NaN > 464)\n"
    "  spyre       the same formula (fms-mo scaled_paged_attn_store)\n"
    "  exact       RNE of the exact x / s, no saturation\n"
    "Scales (f32): tensor [1], head [Hkv] or seq [B] (needs --query-start-loc, [B+1] int32 token ranges). Given\n"
    "with --k-scale/--v-scale, or --dynamic: K amax/200, V amax/100, floored at 1e-5, computed in the model dtype\n"
    "(Spyre), written to --out-k-scale/--out-v-scale.\n"
    "\n"
    "Files: K, V are '<f4' (f32), '<f2' (f16) or '<u2' bf16 bit patterns, [T, Hkv, D]; slot mapping int64 (or int32)\n"
    "[T]; caches uint8 codes [num_blocks, block_size, Hkv, D] (nhd) or [num_blocks, Hkv, block_size, D] (hnd).\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

const char* kAttnHelp =
    "Usage: fp8ref paged-attention --convention C --md F --q Q.npy --query-start-loc QSL.npy\n"
    "                              --k-cache KC.npy [--v-cache VC.npy] --k-scale KS.npy [--v-scale VS.npy]\n"
    "                              (--block-table BT.npy --seq-lens SL.npy | --kv-indptr P.npy --kv-indices I.npy\n"
    "                               --kv-last-page-len L.npy) -o OUT.npy [options]\n"
    "\n"
    "Attention of queries [T, Hq, Dk] (sequence b owns rows query_start_loc[b] .. query_start_loc[b+1]: the last\n"
    "q_len positions of its seq_len keys; 1 = decode, more = a chunked-prefill chunk) over a paged FP8 KV cache,\n"
    "rounding step by rounding step as the named stack does (include/fp8ref/attention.h lists every step):\n"
    "  exact                f64 throughout, one rounding at the output\n"
    "  vllm-paged-v1        vLLM paged_attention_v1 (CUDA): normalized P rounded to md, +1e-6 denominator\n"
    "  vllm-triton-unified  vLLM Triton unified attention (2D or 3D kernel as vLLM picks): online softmax, P to md\n"
    "  flashinfer           FlashInfer batch decode: K scale folded into sm_scale, exp2, V scale after the kernel,\n"
    "                       split-KV as FlashInfer plans it (prefill rows: the decode kernel's steps)\n"
    "  torch-sdpa-math      PyTorch CPU math SDPA on the dequantized cache (bit for bit, torch 2.11)\n"
    "  spyre                fms-mo scaled_paged_attn_compute (math SDPA on md-dequantized K/V)\n"
    "  fast                 the CPU fallback (AMX where available): not bit-exact, within a derived bound of\n"
    "                       exact (attention.h); --backend cpu only; no --k-new/--v-new\n"
    "\n"
    "Files: Q '<f4'/'<f2'/'<u2'(bf16); int arrays int32 (int64 accepted); caches uint8 codes (layout as in\n"
    "kv-cache-write; V absent with --mla); scales f32 [1], [Hkv] or [B]. OUT is written in --out-dtype (bf16 as\n"
    "'<u2'), [T, Hq, Dv]. Hq comes from Q, Hkv/block size/Dk from the K cache.\n"
    "\n"
    "Options:\n"
    "  --cache-format F     e4m3fn (default) or e5m2\n"
    "  --layout L           nhd (default) or hnd\n"
    "  --scale-kind K       tensor (default), head, seq\n"
    "  --out-dtype F        f32, bf16, f16 (default: --md; e4m3fn with --out-scale: OUT in uint8 codes)\n"
    "  --out-scale S        vllm-triton-unified: vLLM's fused output quantization (output_scale): the e4m3fn code\n"
    "                       of clamp(RN32(o·RN32(1/S)), -448, 448)\n"
    "  --sm-scale X         softmax scale (default 1/sqrt(Dk))\n"
    "  --causal C           bottom-right (default), top-left, none\n"
    "  --window-left N      sliding window: keys >= qpos - N (N >= 0; default none)\n"
    "  --softcap X          logit soft-cap cap·tanh(l / cap) (exact, vllm-triton-unified, fast)\n"
    "  --mla                V = K cache[..., :Dv] (give --head-dim-v, e.g. 512 of 576)\n"
    "  --head-dim-v N       Dv (default Dk)\n"
    "  --torch-lanes N      torch-sdpa-math/spyre: 16 (AVX512, default) or 8 (AVX2)\n"
    "  --segments S         vllm-triton-unified: 0 = one online pass per row (vLLM's 2D kernel), S = 2..64 = its 3D\n"
    "                       decode kernel with S segments merged by reduce_segments (vLLM: 16). Default: as vLLM\n"
    "                       picks per batch (3D for decode-only batches of <= 128 query blocks x KV heads)\n"
    "  --tile N             vllm-triton-unified/flashinfer: keys per online-softmax tile, a multiple of 16. Default:\n"
    "                       vllm-triton-unified 32 in one pass, 16 with segments (vLLM's tiles); flashinfer 16\n"
    "  --kv-chunk N         flashinfer: split-KV chunks of N keys, merged as FlashInfer merges them (0: one pass).\n"
    "                       Default (-1): as FlashInfer 0.7.4's DecodePlan picks on a 132-SM H100/H200\n"
    "  --fi-kernel K        flashinfer: auto (default: sequences of more than one query token FlashInfer's\n"
    "                       tensor-core prefill kernel, where it exists, the others its CUDA-core decode kernel),\n"
    "                       prefill (every sequence the prefill kernel), decode (every row the decode kernel's steps)\n"
    "  --cta-tile-q N       flashinfer prefill kernel: packed query rows (q_len x G) per CTA, 16, 64 or 128; it sets\n"
    "                       the keys per tile. Default: as FlashInfer's PrefillPlan picks\n"
    "  --prefill-kv-chunk N flashinfer prefill kernel: split-KV chunks of N keys (0: none). Default (-1): as\n"
    "                       FlashInfer 0.7.4's PrefillPlan picks on a 132-SM H100/H200\n"
    "  --k-new F --v-new F  the query rows' own K/V [T, Hkv, D] in md, used unquantized for the chunk's keys\n"
    "                       (vLLM prefix_prefill, Spyre's non-chunked prefill); not with flashinfer\n"
    "  --backend B          cpu (default) or reference\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

Format format_flag(const char* flag, const std::string& v) {
  Format f;
  if (!parse_format(v, &f)) throw InputError(std::string("unknown format '") + v + "' for " + flag);
  return f;
}

io::DType md_dtype(Format f) { return f == Format::bf16 ? io::DType::U16 : io::format_dtype(f); }

io::Tensor read_dtype(const std::string& path, io::DType want, const char* what) {
  io::Tensor t = io::read_npy(path);
  if (t.dtype != want)
    throw InputError(path + ": " + what + " has dtype " + io::dtype_name(t.dtype) + ", expected " + io::dtype_name(want));
  return t;
}

void expect_shape(const std::string& path, const io::Tensor& t, const std::vector<int64_t>& shape, const char* what) {
  if (t.shape != shape)
    throw InputError(path + ": " + what + " has shape " + shape_text(t.shape) + ", expected " + shape_text(shape));
}

// An int32 or int64 array of rank `rank` as int32 values (range-checked) or int64.
template <typename T>
std::vector<T> read_ints(const std::string& path, size_t rank, const char* what, std::vector<int64_t>* shape) {
  io::Tensor t = io::read_npy(path);
  if (t.dtype != io::DType::I32 && t.dtype != io::DType::I64)
    throw InputError(path + ": " + what + " must be int32 or int64, not " + io::dtype_name(t.dtype));
  if (t.shape.size() != rank)
    throw InputError(path + ": " + what + " must have rank " + std::to_string(rank) + ", has shape " + shape_text(t.shape));
  std::vector<T> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v;
    if (t.dtype == io::DType::I32) {
      int32_t x;
      std::memcpy(&x, &t.data[4 * i], 4);
      v = x;
    } else {
      std::memcpy(&v, &t.data[8 * i], 8);
    }
    if (static_cast<int64_t>(static_cast<T>(v)) != v)
      throw InputError(path + ": " + what + " element " + std::to_string(i) + " = " + std::to_string(v) + " is out of range");
    out[i] = static_cast<T>(v);
  }
  *shape = t.shape;
  return out;
}

std::vector<float> read_scales(const std::string& path, int64_t n, const char* what, attn::KvScaleKind kind) {
  io::Tensor t = read_dtype(path, io::DType::F32, what);
  if (t.shape != std::vector<int64_t>{n})
    throw InputError(path + ": " + what + " has shape " + shape_text(t.shape) + ", but --scale-kind " +
                     attn::to_string(kind) + " needs (" + std::to_string(n) + ",)");
  std::vector<float> v(static_cast<size_t>(n));
  std::memcpy(v.data(), t.data.data(), t.data.size());
  for (size_t i = 0; i < v.size(); ++i)  // (a scale of 0, or NaN, turns the whole cache into ±max or NaN)
    if (!(v[i] > 0) || !std::isfinite(v[i]))
      throw InputError(path + ": " + what + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                       ": a scale must be positive and finite");
  return v;
}

attn::CacheShape cache_from(const io::Tensor& t, const std::string& path, Format f, attn::KvLayout layout) {
  if (t.shape.size() != 4)
    throw InputError(path + ": a cache has rank 4 ([blocks, block_size, Hkv, D] or [blocks, Hkv, block_size, D]), not " +
                     shape_text(t.shape));
  attn::CacheShape c;
  c.format = f;
  c.layout = layout;
  c.num_blocks = t.shape[0];
  c.block_size = layout == attn::KvLayout::nhd ? t.shape[1] : t.shape[2];
  c.num_kv_heads = layout == attn::KvLayout::nhd ? t.shape[2] : t.shape[1];
  c.head_dim = t.shape[3];
  return c;
}

std::string backend_of(const Args& args) {
  const std::string b = args.get("--backend").value_or("cpu");
  if (b != "cpu" && b != "reference") throw UsageError("unknown backend '" + b + "' for --backend (cpu, reference)");
  return b;
}

// A library check of the arguments together (attn::check_*): its InputError names the input files they came from
// (every path but the outputs, their indices in check_paths).
template <class Check>
void check_naming_inputs(Check check, const std::vector<std::string>& paths, const std::vector<size_t>& outputs) {
  try {
    check();
  } catch (const InputError& e) {
    std::string files;
    for (size_t i = 0; i < paths.size(); ++i)
      if (std::find(outputs.begin(), outputs.end(), i) == outputs.end()) files += (files.empty() ? "" : ", ") + paths[i];
    throw InputError(std::string(e.what()) + " (inputs " + files + ")");
  }
}

int write_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--convention"}, {"--model"}, {"--k"}, {"--v"}, {"--slot-mapping"}, {"--k-cache"}, {"--v-cache"},
             {"--out-k-cache"}, {"--out-v-cache"}, {"--k-scale"}, {"--v-scale"}, {"--dynamic", Kind::flag},
             {"--out-k-scale"}, {"--out-v-scale"}, {"--cache-format"}, {"--layout"}, {"--scale-kind"},
             {"--query-start-loc"}, {"--backend"}});
  args.expect_positionals({});
  attn::KvWriteSpec spec;
  if (!attn::parse_store_convention(args.require("--convention"), &spec.convention))
    throw InputError("unknown --convention '" + *args.get("--convention") + "' (vllm-cuda, sglang, spyre, exact)");
  spec.model = format_flag("--model", args.require("--model"));
  if (spec.model != Format::f32 && spec.model != Format::bf16 && spec.model != Format::f16)
    throw InputError("--model must be f32, bf16 or f16");
  const Format cf = format_flag("--cache-format", args.get("--cache-format").value_or("e4m3fn"));
  attn::KvLayout layout;
  if (!attn::parse_kv_layout(args.get("--layout").value_or("nhd"), &layout)) throw InputError("--layout is nhd or hnd");
  if (!attn::parse_kv_scale_kind(args.get("--scale-kind").value_or("tensor"), &spec.scale_kind))
    throw InputError("--scale-kind is tensor, head or seq");
  spec.dynamic = args.has("--dynamic");
  const std::string backend = backend_of(args);
  std::vector<std::string> paths = {args.require("--k"), args.require("--v"), args.require("--slot-mapping"),
                                    args.require("--k-cache"), args.require("--v-cache"), args.require("--out-k-cache"),
                                    args.require("--out-v-cache")};
  if (spec.dynamic) {
    if (args.has("--k-scale") || args.has("--v-scale")) throw UsageError("--dynamic computes the scales: no --k-scale/--v-scale");
    paths.push_back(args.require("--out-k-scale"));
    paths.push_back(args.require("--out-v-scale"));
  } else {
    if (args.has("--out-k-scale") || args.has("--out-v-scale")) throw UsageError("--out-k-scale/--out-v-scale need --dynamic");
    paths.push_back(args.require("--k-scale"));
    paths.push_back(args.require("--v-scale"));
  }
  if (auto q = args.get("--query-start-loc")) paths.push_back(*q);
  const std::vector<size_t> outputs = spec.dynamic ? std::vector<size_t>{5, 6, 7, 8} : std::vector<size_t>{5, 6};
  check_paths(paths, outputs);

  const io::Tensor k = read_dtype(paths[0], md_dtype(spec.model), "K");
  const io::Tensor v = read_dtype(paths[1], md_dtype(spec.model), "V");
  std::vector<int64_t> sm_shape;
  const std::vector<int64_t> slots = read_ints<int64_t>(paths[2], 1, "slot_mapping", &sm_shape);
  io::Tensor kc = read_dtype(paths[3], io::DType::U8, "K cache");
  io::Tensor vc = read_dtype(paths[4], io::DType::U8, "V cache");
  spec.cache = cache_from(kc, paths[3], cf, layout);
  expect_shape(paths[4], vc, kc.shape, "V cache");
  if (k.shape.size() != 3 || k.shape[1] != spec.cache.num_kv_heads || k.shape[2] != spec.cache.head_dim)
    throw InputError(paths[0] + ": K has shape " + shape_text(k.shape) + ", expected (T, " +
                     std::to_string(spec.cache.num_kv_heads) + ", " + std::to_string(spec.cache.head_dim) + ") to match the cache");
  expect_shape(paths[1], v, k.shape, "V");
  const int64_t T = k.shape[0];
  if (static_cast<int64_t>(slots.size()) != T)
    throw InputError(paths[2] + ": slot_mapping has " + std::to_string(slots.size()) + " entries for " + std::to_string(T) + " tokens");
  std::vector<int32_t> qsl;
  int64_t B = 1;
  if (auto q = args.get("--query-start-loc")) {
    std::vector<int64_t> sh;
    qsl = read_ints<int32_t>(*q, 1, "query_start_loc", &sh);
    if (qsl.size() < 2) throw InputError(*q + ": query_start_loc needs at least 2 entries");
    B = static_cast<int64_t>(qsl.size()) - 1;
  } else if (spec.scale_kind == attn::KvScaleKind::seq) {
    throw UsageError("--scale-kind seq needs --query-start-loc");
  }
  const int64_t ns = attn::num_scales(spec.scale_kind, spec.cache.num_kv_heads, B);
  std::vector<float> ks(static_cast<size_t>(ns)), vs(static_cast<size_t>(ns));
  if (!spec.dynamic) {
    ks = read_scales(paths[7], ns, "k_scale", spec.scale_kind);
    vs = read_scales(paths[8], ns, "v_scale", spec.scale_kind);
  }
  attn::KvWriteArgs a;
  a.num_tokens = T;
  a.k = k.data.data();
  a.v = v.data.data();
  a.slot_mapping = slots.data();
  a.num_seqs = B;
  a.query_start_loc = qsl.empty() ? nullptr : qsl.data();
  a.k_scale = ks.data();
  a.v_scale = vs.data();
  a.k_cache = kc.data.data();
  a.v_cache = vc.data.data();
  check_naming_inputs([&] { attn::check_kv_cache_write(spec, a); }, paths, outputs);
  if (backend == "cpu") attn::cpu::kv_cache_write(spec, a);
  else attn::ref::kv_cache_write(spec, a);
  io::OutputFiles files;  // all written, or none
  files.add_npy(paths[5], kc);
  files.add_npy(paths[6], vc);
  if (spec.dynamic) {
    io::Tensor kst = io::make_tensor("", io::DType::F32, {ns}), vst = io::make_tensor("", io::DType::F32, {ns});
    std::memcpy(kst.data.data(), ks.data(), kst.data.size());
    std::memcpy(vst.data.data(), vs.data(), vst.data.size());
    files.add_npy(paths[7], kst);
    files.add_npy(paths[8], vst);
  }
  files.commit();
  return 0;
}

int attn_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--convention"}, {"--md"}, {"--q"}, {"--query-start-loc"}, {"--k-cache"}, {"--v-cache"}, {"--k-scale"},
             {"--v-scale"}, {"--block-table"}, {"--seq-lens"}, {"--kv-indptr"}, {"--kv-indices"}, {"--kv-last-page-len"},
             {"--out", Kind::value, "-o"}, {"--cache-format"}, {"--layout"}, {"--scale-kind"}, {"--out-dtype"},
             {"--sm-scale"}, {"--causal"}, {"--window-left"}, {"--softcap"}, {"--out-scale"}, {"--mla", Kind::flag}, {"--head-dim-v"},
             {"--torch-lanes"}, {"--tile"}, {"--segments"}, {"--kv-chunk"}, {"--fi-kernel"}, {"--cta-tile-q"},
             {"--prefill-kv-chunk"}, {"--backend"}, {"--k-new"}, {"--v-new"}});
  args.expect_positionals({});
  attn::AttnSpec spec;
  if (!attn::parse_attn_convention(args.require("--convention"), &spec.convention))
    throw InputError("unknown --convention '" + *args.get("--convention") +
                     "' (exact, vllm-paged-v1, vllm-triton-unified, flashinfer, torch-sdpa-math, spyre, fast)");
  spec.q_format = format_flag("--md", args.require("--md"));
  spec.out_format = format_flag("--out-dtype", args.get("--out-dtype").value_or(
                                                   args.get("--out-scale") ? "e4m3fn" : format_name(spec.q_format)));
  const Format cf = format_flag("--cache-format", args.get("--cache-format").value_or("e4m3fn"));
  attn::KvLayout layout;
  if (!attn::parse_kv_layout(args.get("--layout").value_or("nhd"), &layout)) throw InputError("--layout is nhd or hnd");
  if (!attn::parse_kv_scale_kind(args.get("--scale-kind").value_or("tensor"), &spec.scale_kind))
    throw InputError("--scale-kind is tensor, head or seq");
  if (!attn::parse_causal(args.get("--causal").value_or("bottom-right"), &spec.causal))
    throw InputError("--causal is bottom-right, top-left or none");
  auto num = [&](const char* flag, double dflt) {
    const auto v = args.get(flag);
    if (!v) return dflt;
    size_t pos = 0;
    double x = 0;
    try {
      x = std::stod(*v, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != v->size()) throw UsageError(std::string(flag) + " needs a number, not '" + *v + "'");
    return x;
  };
  spec.sm_scale = num("--sm-scale", 0);
  if (args.has("--sm-scale") && !(spec.sm_scale > 0 && std::isfinite(spec.sm_scale)))
    throw InputError("--sm-scale must be positive and finite, not '" + *args.get("--sm-scale") + "'");
  auto integer = [&](const char* flag, long long dflt, long long lo, long long hi) {
    const auto v = args.get(flag);
    return v ? parse_integer(flag, *v, lo, hi) : dflt;
  };
  spec.window_left = integer("--window-left", -1, 0, std::numeric_limits<int64_t>::max());
  spec.softcap = num("--softcap", 0);
  if (!(spec.softcap >= 0 && std::isfinite(spec.softcap)))
    throw InputError("--softcap must be >= 0 and finite (0: none), not '" + *args.get("--softcap") + "'");
  spec.out_scale = num("--out-scale", 0);
  if (args.get("--out-scale") && !(spec.out_scale > 0 && std::isfinite(spec.out_scale)))
    throw InputError("--out-scale must be positive and finite, not '" + *args.get("--out-scale") + "'");
  spec.torch_lanes = static_cast<int>(integer("--torch-lanes", 16, 1, 64));
  spec.tile = integer("--tile", 0, 0, 4096);  // (0, -1: the defaults; attn::check_paged_attention says what else is valid)
  spec.segments = integer("--segments", -1, -1, 4096);
  spec.kv_chunk = integer("--kv-chunk", -1, -1, std::numeric_limits<int32_t>::max());
  if (!attn::parse_fi_kernel(args.get("--fi-kernel").value_or("auto"), &spec.fi_kernel))
    throw InputError("--fi-kernel is auto, prefill or decode");
  spec.cta_tile_q = integer("--cta-tile-q", 0, 0, 4096);
  spec.prefill_kv_chunk = integer("--prefill-kv-chunk", -1, -1, std::numeric_limits<int32_t>::max());
  spec.v_from_k = args.has("--mla");
  spec.head_dim_v = integer("--head-dim-v", 0, 1, std::numeric_limits<int32_t>::max());
  const std::string backend = backend_of(args);
  const bool csr = args.has("--kv-indptr");
  std::vector<std::string> paths = {args.require("--q"), args.require("--query-start-loc"), args.require("--k-cache"),
                                    args.require("--k-scale"), args.require("--out")};
  if (!spec.v_from_k) {
    paths.push_back(args.require("--v-cache"));
    paths.push_back(args.require("--v-scale"));
  } else if (args.has("--v-cache") || args.has("--v-scale")) {
    throw UsageError("--mla reads V from the K cache: no --v-cache/--v-scale");
  }
  spec.chunk_unquantized = args.has("--k-new");
  if (spec.chunk_unquantized) {
    paths.push_back(args.require("--k-new"));
    if (!spec.v_from_k) paths.push_back(args.require("--v-new"));
  }
  if (args.has("--v-new") && (!spec.chunk_unquantized || spec.v_from_k))
    throw UsageError("--v-new goes with --k-new (and not with --mla)");
  if (csr) {
    if (args.has("--block-table") || args.has("--seq-lens")) throw UsageError("give the dense table or the CSR one, not both");
    for (const char* f : {"--kv-indptr", "--kv-indices", "--kv-last-page-len"}) paths.push_back(args.require(f));
  } else {
    paths.push_back(args.require("--block-table"));
    paths.push_back(args.require("--seq-lens"));
  }
  check_paths(paths, {4});

  io::Tensor kc = read_dtype(args.require("--k-cache"), io::DType::U8, "K cache");
  spec.cache = cache_from(kc, args.require("--k-cache"), cf, layout);
  const io::Tensor q = read_dtype(args.require("--q"), md_dtype(spec.q_format), "Q");
  if (q.shape.size() != 3 || q.shape[2] != spec.cache.head_dim)
    throw InputError(args.require("--q") + ": Q has shape " + shape_text(q.shape) + ", expected (T, Hq, " +
                     std::to_string(spec.cache.head_dim) + ")");
  spec.num_q_heads = q.shape[1];
  if (spec.num_q_heads < 1 || spec.num_q_heads % spec.cache.num_kv_heads != 0)
    throw InputError(args.require("--q") + ": Q has " + std::to_string(spec.num_q_heads) + " query head" +
                     (spec.num_q_heads == 1 ? "" : "s") + ", not a multiple of the " +
                     std::to_string(spec.cache.num_kv_heads) + " KV head" + (spec.cache.num_kv_heads == 1 ? "" : "s") +
                     " of the K cache " + args.require("--k-cache"));
  const int64_t T = q.shape[0];
  std::vector<int64_t> sh;
  const std::vector<int32_t> qsl = read_ints<int32_t>(args.require("--query-start-loc"), 1, "query_start_loc", &sh);
  if (qsl.empty()) throw InputError(args.require("--query-start-loc") + ": query_start_loc is empty");
  const int64_t B = static_cast<int64_t>(qsl.size()) - 1;
  io::Tensor vc;
  attn::CacheShape vshape = spec.cache;
  if (!spec.v_from_k) {
    vc = read_dtype(args.require("--v-cache"), io::DType::U8, "V cache");
    vshape = cache_from(vc, args.require("--v-cache"), cf, layout);
    if (vshape.num_blocks != spec.cache.num_blocks || vshape.block_size != spec.cache.block_size ||
        vshape.num_kv_heads != spec.cache.num_kv_heads)
      throw InputError(args.require("--v-cache") + ": V cache " + shape_text(vc.shape) + " does not match the K cache " +
                       shape_text(kc.shape) + " (only D may differ)");
    if (spec.head_dim_v == 0) spec.head_dim_v = vshape.head_dim;
    if (spec.head_dim_v != vshape.head_dim)
      throw InputError("--head-dim-v " + std::to_string(spec.head_dim_v) + " but the V cache has D = " + std::to_string(vshape.head_dim));
  }
  const int64_t ns = attn::num_scales(spec.scale_kind, spec.cache.num_kv_heads, B);
  const std::vector<float> ks = read_scales(args.require("--k-scale"), ns, "k_scale", spec.scale_kind);
  const std::vector<float> vs = spec.v_from_k ? std::vector<float>{} : read_scales(args.require("--v-scale"), ns, "v_scale", spec.scale_kind);
  std::vector<int32_t> bt, sl, indptr, indices, last;
  attn::AttnArgs a;
  a.num_seqs = B;
  a.num_tokens = T;
  // a table's length against B (from query_start_loc): an error names both files
  auto expect_len = [&](const char* flag, const char* what, int64_t got, int64_t want, const char* unit, const char* b) {
    if (got != want)
      throw InputError(args.require(flag) + ": " + what + " has " + std::to_string(got) + " " + unit + ", expected " + b +
                       " = " + std::to_string(want) + " (B from " + args.require("--query-start-loc") + ")");
  };
  if (csr) {
    indptr = read_ints<int32_t>(args.require("--kv-indptr"), 1, "kv_indptr", &sh);
    expect_len("--kv-indptr", "kv_indptr", static_cast<int64_t>(indptr.size()), B + 1, "entries", "B+1");
    indices = read_ints<int32_t>(args.require("--kv-indices"), 1, "kv_indices", &sh);
    last = read_ints<int32_t>(args.require("--kv-last-page-len"), 1, "kv_last_page_len", &sh);
    expect_len("--kv-last-page-len", "kv_last_page_len", static_cast<int64_t>(last.size()), B, "entries", "B");
    a.table.indptr = indptr.data();
    a.table.indices = indices.data();
    a.table.num_indices = static_cast<int64_t>(indices.size());
    a.table.last_page_len = last.data();
  } else {
    bt = read_ints<int32_t>(args.require("--block-table"), 2, "block_table", &sh);
    expect_len("--block-table", "block_table", sh[0], B, "rows", "B");
    a.table.max_blocks = sh[1];
    sl = read_ints<int32_t>(args.require("--seq-lens"), 1, "seq_lens", &sh);
    expect_len("--seq-lens", "seq_lens", static_cast<int64_t>(sl.size()), B, "entries", "B");
    a.table.block_table = bt.data();
    a.table.seq_lens = sl.data();
  }
  io::Tensor knew, vnew;
  if (spec.chunk_unquantized) {
    knew = read_dtype(args.require("--k-new"), md_dtype(spec.q_format), "K of the chunk");
    expect_shape(args.require("--k-new"), knew, {T, spec.cache.num_kv_heads, spec.cache.head_dim}, "K of the chunk");
    a.k_new = knew.data.data();
    if (!spec.v_from_k) {
      vnew = read_dtype(args.require("--v-new"), md_dtype(spec.q_format), "V of the chunk");
      expect_shape(args.require("--v-new"), vnew, {T, spec.cache.num_kv_heads, spec.dv()}, "V of the chunk");
      a.v_new = vnew.data.data();
    }
  }
  a.q = q.data.data();
  a.query_start_loc = qsl.data();
  a.k_cache = kc.data.data();
  a.v_cache = spec.v_from_k ? nullptr : vc.data.data();
  a.k_scale = ks.data();
  a.v_scale = spec.v_from_k ? nullptr : vs.data();
  check_naming_inputs([&] { attn::check_paged_attention(spec, a); }, paths, {4});
  io::Tensor out = io::make_tensor("", spec.out_format == Format::e4m3fn ? io::DType::U8 : md_dtype(spec.out_format),
                                   {T, spec.num_q_heads, spec.dv()});
  a.out = out.data.data();
  if (backend == "cpu") attn::cpu::paged_attention(spec, a);
  else attn::ref::paged_attention(spec, a);
  io::write_npy(args.require("--out"), out);
  return 0;
}

}  // namespace

const Command kCmd_kv_cache_write = {"kv-cache-write", "quantize K/V into a paged FP8 KV cache (.npy), as vLLM/sglang/Spyre do",
                                     &write_main, kWriteHelp};
const Command kCmd_paged_attention = {"paged-attention", "attention over a paged FP8 KV cache (.npy), per convention",
                                      &attn_main, kAttnHelp};

}  // namespace fp8ref::cli
