// fp8ref — paged attention over an FP8 KV cache: the cache write (kv_cache_write) and the attention itself
// (paged_attention: decode and chunked prefill, mixed in one batch), under named conventions
// (../shared/NUMERICS.md §6; research/paged-attention-conventions.md, cited below as "pac §x").
//
// ---- The cache ------------------------------------------------------------------------------------------------
// Two FP8 tensors (K and V; e4m3fn or e5m2 codes), each
//   NHD  [num_blocks, block_size, num_kv_heads, D]   (vLLM flash/Triton, Spyre, FlashInfer NHD; pac a.2.3)
//   HND  [num_blocks, num_kv_heads, block_size, D]   (FlashInfer HND, vLLM flash HND)
// Token position p of a sequence lives in page table[p / block_size] at slot p % block_size; a flat slot s is
// (block s / block_size, offset s % block_size). MLA (DeepSeek, head dims 576/512): one latent cache with D = 576
// holds K; V is its first Dv = 512 dims (v_from_k; the V cache and the V scale are then the K ones).
//
// ---- Scales (f32 values, always given or produced as f32) -----------------------------------------------------
//   tensor  [1]      per layer (vLLM, FlashInfer)                    pac a.2.5, a.2.7
//   head    [Hkv]    per KV head (vLLM attn_head, FA3 descales)       pac a.2.5
//   seq     [B]      per sequence (fms-mo ScaledTensor._scale[B])    pac a.1.1
// Dynamic scales (kv_cache_write with dynamic=true) follow the Spyre/fms-mo rule (pac a.1.5; vLLM's calc_kv_scales
// is the same without the floor, pac a.2.7), evaluated in the model dtype md:
//   amax = max |x| over the group (all of its tokens, pads and slot −1 tokens included; all heads / one head; all D)
//   s = max( RN_md(RN32(amax / R)), RN_md(1e-5) ),  R = 200 for K, 100 for V;  NaN amax -> NaN scale.
// A group with no token has amax = 0 (s = the floor).
//
// ---- kv_cache_write (pac a.1.4, a.2.5, 0.2, 0.4, 0.8) ----------------------------------------------------------
// K, V: [T, Hkv, D] in md (f32, bf16, f16). slot_mapping[T] (int64): −1 (any negative value) = skip the token
// (vLLM PAD_SLOT_ID); otherwise 0 <= slot < num_blocks·block_size. Per element x (md) and its scale s:
//   vllm-cuda  code = satfinite_RNE( RN32(f32(x) / s) )               (reshape_and_cache_flash, CUDA cvt satfinite)
//   sglang     code = torch_cast( RN_md(RN32(f32(x) / s)) )           (bf16/f16 tensor / 0-dim f32 scale, then .to(fp8):
//                                                                      RNE, e4m3fn |v| > 464 -> NaN, e5m2 -> ±Inf)
//   spyre      the same formula as sglang (fms-mo scaled_paged_attn_store; pac a.1.4) — kept as its own name
//   exact      code = RNE of the exact quotient x/s, no saturation (e4m3fn overflow -> NaN, e5m2 -> ±Inf)
// Tokens are written in index order; a slot written twice keeps the last write (as on a GPU only by luck).
//
// ---- paged_attention ------------------------------------------------------------------------------------------
// q: [Tq, Hq, Dk] in md; query_start_loc[B+1] (int32, non-decreasing, from 0 to Tq): sequence b owns query rows
// [qsl[b], qsl[b+1]) — its q_len tokens, the last q_len positions of its context: query row i sits at position
// ctx + i with ctx = seq_len − q_len (0 <= q_len <= seq_len). Decode: q_len = 1; chunked prefill: a chunk whose own
// K/V were written into the cache first (vLLM V1, Spyre; pac c.1.4, c.3.2) — or, with chunk_unquantized, whose own
// keys are read unquantized from k_new/v_new (vLLM prefix_prefill, pac c.3.3). Mixed freely in one batch.
// Page table, one of:
//   dense  block_table[B, max_blocks] (int32) + seq_lens[B] (int32); needs ceil(seq_len/bs) <= max_blocks
//   CSR    indptr[B+1], indices[nnz], last_page_len[B] (int32, FlashInfer; pac a.3.1):
//          seq_len = (indptr[b+1] − indptr[b] − 1)·bs + last_page_len[b] (0 pages -> seq_len 0), 1 <= last <= bs
// GQA/MQA: q head h reads KV head h / (Hq/Hkv) (pac b.1.3). Output [Tq, Hq, Dv] in f32, bf16 or f16.
// Mask (pac b.1.4, c.4, c.5): with qpos = ctx + i (bottom-right, every paged kernel) or i (top-left, torch
// is_causal=True) key j is visible iff j <= qpos (none: every key of the sequence) and, with a sliding window
// window_left >= 0, j >= qpos − window_left (FlashInfer's window_left; vLLM's sliding_window = window_left + 1).
// Soft-cap (cap > 0): logit -> cap·tanh(logit / cap), after sm_scale (exact, vllm-triton-unified and fast).
// Keys outside [0, seq_len) are never read: a cache may hold NaN in every unused slot.
// A NaN output element is stored as the canonical quiet NaN (+; f32 0x7FC00000, bf16 0x7FC0, f16 0x7E00) by every
// bit-exact convention and backend: which NaN operand propagates (sign, payload) is an operand-order artefact.
//
// ---- Conventions (every f32 step one IEEE binary32 operation, RNE; md = the query dtype) -------------------------
// Shared definitions:
//   deq_md(c, s)  = RN_md(RN32(f32(c)·s))                  (fms-mo, Triton, vLLM scaled_convert; pac 0.5, b.1.5)
//   dot(a, b)     = Σ_d a_d·b_d, f32, d = 0, 1, ..., from +0, each step one fma (a fixed order of ours: the GPU's
//                   tensor-core / warp order is not modelled; the torch CPU BLAS order is the guess tested on the
//                   device capture)
//   exp(x)        = Sleef xexpf (u10, FMA form; the exp of torch's Vectorized<float>), see ref::exp_sleef
//   exp2(x)       = Sleef-style xexp2f (FMA form), see ref::exp2_sleef
// exact
//   k̂, v̂ = value(c)·s exactly (f64); l_j = sm_scale·Σ_d q_d k̂_jd (f64, d in order; each product exact);
//   soft-cap in f64 (std::tanh); p_j = exp(l_j − max l) (f64, std::exp); o = Σ p_j v̂_j / Σ p_j (f64, j in order);
//   out = RN_out(o), rounded once. Error of the f64 path against exact math, per output element (u = 2^-53):
//     E_l = max_j (Dk + 3)·u·sm_scale·Σ_d |q_d k̂_jd|   (+ with soft-cap 4u·cap)
//     |o_f64 − o| <= max_j|v̂_j| · (4·E_l + (2·n + 8)·u)   for n visible keys   (bound_exact_f64 below)
//   (|Δ(l−m)| <= 2E_l, exp adds <= 2u relative, so each p_j is off by <= e^{2E_l+2u} − 1 relative; a ratio of sums
//   of such weights moves o by at most twice that times max|v̂|, plus the n + 2 roundings of the two sums.)
// vllm-paged-v1 (csrc/attention/attention_kernels.cuh paged_attention_kernel; pac b.2)
//   1. k̂ = deq_md(k8, sk); for md = f32 through f16: RN_f16 of RN32(f32(k8)·sk) (scaled_convert vector quirk, 0.5)
//   2. l_j = RN32(RN32(sm_scale)·dot(q, k̂_j));  m = max l_j
//   3. p_j = exp(RN32(l_j − m)); S = Σ p_j (f32, j in order); inv = RN32(1 / RN32(S + 1e-6f))
//   4. p̃_j = RN_md(RN32(p_j·inv))  (normalized, then from_float to md)
//   5. v̂ = as k̂; acc_d = Σ_j p̃_j·v̂_jd (f32, j in order, fma from +0); out = RN_out(acc_d)
// vllm-triton-unified (vllm/attention/ops/triton_unified_attention.py kernel_unified_attention_2d; pac b.3, c.3)
//   vLLM's kernels as Triton 3.6 builds them for an NVIDIA GPU, step by step (each measured on an H100:
//   tests/data/h200/triton_dot/, triton_dot_fp8/, triton_rowsum/, triton_segsum/, triton_exp_pairs.npy; the kernels
//   themselves: vllm_unified_attention.npz, _f16.npz). With md = bf16 or f16 (triton_tensor_cores) the two tl.dot run
//   on the tensor cores: mma.sync m16n8k16 steps chained through the accumulator, in the k order Triton gives operands
//   converted from fp8 in registers — up to 16 k one step, else each block of 32 k as the k with k mod 4 in {0, 1},
//   then {2, 3} (TC(a·b, c) = fp8ref::ref::hmma16_dot_kw4, include/fp8ref/mma.h; per step the terms truncated onto
//   2^(e−25) below the largest nominal exponent, summed exactly, truncated to 24 bits); with md = f32 (TF32 in Triton:
//   not modelled) the dots are f32 FMAs in order (TC(a·b, c) = fma chain from c). exp = tl.exp = ex2.approx(RN32(x·RN32(log2 e)))
//   (fp8ref::ref::triton_exp); x ÷ y = Triton's division (div.full.f32: RN32(x·MUFU.RCP(y)), fp8ref::ref::triton_nv_div).
//   k̂, v̂ = deq_md; l_j = RN32(RN32(sm_scale)·TC(q·k̂_j, +0)); soft-cap: l = RN32(cap·RN32(p1 − p2)) ÷ RN32(p1 + p2)
//   with p1 = exp(l ÷ cap), p2 = exp(−(l ÷ cap)) (Triton apply_softcap). Online over tiles of T keys
//   (T = AttnSpec::tile, 32 by default: [Tt, Tt+T) of the sequence; a tile with no visible key changes nothing
//   once M is finite); M = −inf, L = 1, acc = 0 — or M = 0, L = 0 where the first tile vLLM's kernel walks for the
//   row holds no visible key (triton_starts_at_zero: vLLM's where(m_j > −inf, m_j, 0) guard, with a sliding
//   window); per tile (P_j = 0 in the slots of keys the row does not see):
//     m' = max(M, max l_j); P_j = exp(RN32(l_j − m')); α = exp(RN32(M − m'))  (M = −inf: α = 0)
//     l = tl.sum(P) over the tile's T slots in Triton's order (triton_row_sum below); L = fma(L, α, l) (contracted)
//     acc_d = TC(Σ_slots RN_md(P_j)·v̂_jd, RN32(acc_d·α)) (md f32: RN32(RN32(acc_d·α) + Σ fma from +0)); M = m'
//   out = RN_out(acc_d ÷ L)
//   With S segments (AttnSpec::segments; vLLM's 3D decode kernel): tps = cdiv(seq_len, S·T) tiles per segment,
//   act = cdiv(seq_len, tps·T) segments hold keys; segment s runs the steps above over the tiles [s·tps, (s+1)·tps)
//   from M = −inf, L = 1, acc = 0 (M = 0, L = 0 where its first tile holds no visible key: the guard above), giving
//   (M_s, L_s, acc_s) (a segment whose tiles the kernel does not walk stays at −inf, 1, 0);
//   then m = max_{s<act} M_s; w_s = exp(RN32(M_s − m)); den = Σ L_s·w_s over the S slots (0 for s >= act) in
//   Triton's butterfly order (slot i + slot i + S/2, then the halves of that, ...), its first add contracted on the
//   storing lane's side (fma(L_l, w_l, RN32(L_l^S/2·w_l^S/2))); num_d = Σ acc_s,d·w_s in the order of
//   reduce_segments' [S, Dpad] blocked layout with the products contracted into each thread's adds (fma(a0, w0,
//   RN32(a1·w1)), then fma(ak, wk, ·)), or, one segment a thread, into the first lane shuffle's add
//   (triton_reduce_segments below: Triton compiles with fp fusion);
//   out = RN_out(den == 0 ? 0 : num_d ÷ den).
//   Against vLLM's own kernels on an H100: every one of 335,872 bf16 and 172,032 f16 outputs bit-equal
//   (docs/attention.md).
// flashinfer (include/flashinfer/attention/decode.cuh, variants.cuh; flashinfer/decode.py; pac b.4, c.4): FlashInfer's
//   CUDA-core batch decode kernel for the sequences it runs (AttnSpec::fi_kernel: by default those of one query token;
//   the others take the prefill kernel below).
//   k = f32(k8) (no scale); c = RN32(RN64(sm_scale·sk)) then c2 = RN32(c·RN32(log2 e)) (k scale folded into
//   sm_scale on the Python side); s_j = RN32(dot(q, k_j)·c2). exp2 here is the GPU's: MUFU.EX2 (ex2.approx.ftz,
//   ref::mufu_ex2, include/fp8ref/mufu_ex2.h); lg2 the exact log2 rounded to f32 (fp8ref's stand-in for lg2.approx,
//   on [1, 2) within 2^-22.6 of it). Online over tiles of T keys (AttnSpec::tile, 16 by default), m = −inf,
//   d = 1, o = 0:
//     m' = max(m, max s_j); a = exp2(RN32(m − m')); o_d = RN32(o_d·a); d = RN32(d·a);
//     p_j = exp2(RN32(s_j − m')); per key in order: d = RN32(d + p_j), o_d = fma(p_j, f32(v8_jd), o_d); m = m'
//   o = RN_out(RN32(o_d·rcp(d))), rcp = MUFU.RCP (rcp.approx.ftz: ref::mufu_rcp, the captured table of
//   triton_div.h); then (v scale applied after the kernel, in the output dtype) if sv != 1:
//   out = RN_out(RN32(f32(o)·sv)).  No soft-cap (FlashInfer's variant is not modelled).
//   Split-KV (AttnSpec::kv_chunk = C > 0, a sequence of more than one chunk; decode.cuh partition_kv, cascade.cuh
//   PersistentVariableLengthMergeStatesKernel): each chunk [C·c, C·c + C) runs the pass above from m = −inf, d = 1,
//   o = 0 and gives v_c = RN_out(RN32(o_d·rcp(d))) (0 where it sees no key) and s_c = RN32(m + lg2(d)) (−inf where
//   it sees no key). The merge runs in L = 128 / (Dv / max(8, Dv/32)) lanes: lane l takes chunks l, l + L, ... in
//   order into a state (m = −inf, d = 1, o = 0): m' = max(m, s_c); f1 = exp2(RN32(m − m')) (0 when both are −inf),
//   f2 = exp2(RN32(s_c − m')); d = fma(d, f1, f2); o_d = fma(o_d, f1, RN32(v_c,d·f2)) (state_t::merge as nvcc 13.0
//   contracts it, read in its PTX); m = m'; then each lane's w_l = RN_out(RN32(o_d·rcp(d))) (0 for d = 0) and
//   lse_l = RN32(m + lg2(d)), merged the same way over l = 0..L−1 in order, and out = RN_out(RN32(o_d·rcp(d))) (then
//   the v scale as above).
// flashinfer prefill kernel (FlashInfer 0.7.4 attention/prefill.cuh, the FA2 BatchPrefillWithPagedKVCache its
//   backend "auto" takes on Hopper for bf16/f16 q over an fp8 cache; scheduler.cuh PrefillPlan; flashinfer/prefill.py):
//   f = md (bf16 or f16; the kernel's DTypeQ). K and V codes widened exactly to f; c = RN32(RN64(RN64(sm_scale·sk)·
//   log2e_f)) (the K scale folded into sm_scale in Python, ·log2 e in double in the kernel). The row's KV start a0:
//   with a sliding window max(0, seq_len + (qt·cta_tile_q) / G − q_len − window) for the row's q tile
//   qt = (i·G + h mod G) / cta_tile_q (query i of the sequence, q head h), else 0; chunks [a0 + C·k, a0 + C·k + C)
//   (C = AttnSpec::prefill_kv_chunk; one chunk [a0, seq_len) for C = 0). Per chunk, nw KV warps
//   (flashinfer_prefill_tile: T keys a tile; warp w the tiles from the chunk's start + (it·nw + w)·T), each from
//   m = −inf, d = 1, o = 0, per tile (keys outside the row's visible range or the chunk: s = −inf, p = 0):
//     s_j = HMMA chain over dims in steps of 16 from 0 (ref::hmma16_dot(f, q, k_j, Dk, 0); HMMA.16816.F32);
//     m' = max(m, max s_j); mc = max(RN32(m'·c), −FLT_MAX); a = m == −inf ? 0 : ex2(RN32(RN32(m − m')·c));
//     d = RN32(d·a), o_d = RN32(o_d·a) (flushed below 2^-126: -use_fast_math);
//     P_j = RN_f(ex2(fma(s_j, c, −mc))) (ptxas contracts the product and the difference);
//     per 16 keys of the tile in order: d = hmma16_step(f, P, ones, 16, d), o_d = hmma16_step(f, P, v_·d, 16, o_d);
//     m = m'.
//   Then m = RN32(m·c) (m stays −inf; d = 0 for a warp that saw no key). nw > 1 (cta_tile_q 16): m = max over the
//   warps; d = fma(d, ex2(RN32(m_prev − m)), RN32(d_w·ex2(RN32(m_w − m)))) over w = 0..nw−1 in order (from m = −inf,
//   d = 1); o_d = RN32(o_0·sc_0), then fma(o_w, sc_w, o_d), sc_w = ex2(RN32(m_w − m)). One chunk: out =
//   RN_out(RN32(o_d·rcp(d))) (0 where m = −inf), rcp = MUFU.RCP; several: each chunk's (o, m, d) merged as the decode
//   kernel's split-KV chunks (flashinfer_merge_chunks). Then the V scale as in the decode kernel. exp2 = MUFU.EX2
//   (ref::mufu_ex2), NaN arguments (−inf − (−inf)) taken as −inf.
//   Against FlashInfer's own prefill kernel on an H100 (tests/data/h200/flashinfer_prefill.npz, _f16.npz): 216,560 of
//   216,576 bf16 and 105,958 of 105,984 f16 outputs bit-equal, every one of the unsplit batches (docs/attention.md).
// torch-sdpa-math (aten/src/ATen/native/transformers/attention.cpp _scaled_dot_product_attention_math, CPU; pac b.1.7)
//   K̂, V̂ = deq_md (the dequantized cache as md tensors); c = RN32(sqrt(sm_scale)) (double sqrt, then the f32
//   opmath scalar); q' = RN32(f32(q)·c); k'_j = RN32(k̂_j·c) (q·√s and kᵀ·√s, applied separately);
//   x_j = dot(q', k'_j) over every key of the sequence, + mask (0 / −inf, f32);
//   softmax (ATen _vec_softmax_lastdim, Vectorized<float> of W lanes, W = 16 AVX512 / 8 AVX2):
//     m = max x_j; e_j = exp(RN32(x_j − m)); S = reduce_all(+): lane partials P_r = Σ e_j over j ≡ r mod W in
//     order (from the first chunk; a row shorter than W is summed in order j = 0, 1, ...), then the lanes
//     folded as torch's AVX shuffles do: P_r += P_{r+W/2}, then +W/4, ..., +1 -> S = P_0;
//     p_j = RN32(e_j · RN32(1 / S))
//   o_d = Σ_j p_j·v̂_jd (f32, fma from +0, j in order); out = RN_md(o_d).
// spyre (fms-mo spyre::scaled_paged_attn_compute with attn_algorithm=math; pac b.1): the fms-mo dequant
//   K̂ = md(f32(k8)·s[b]) then torch math SDPA with a bottom-right f32 −inf mask: the torch-sdpa-math steps above.
//   (aftu runs the default flash-CPU SDPA backend, pac b.1.7; that kernel's blocking is not modelled.)
// fast (the CPU fallback; src/cpu/attention_fast.{h,cc}): not bit-exact — any summation order, within a derived
//   per-element bound of `exact` (cpu::paged_attention_fast_bound). Mirrors GemmModel fast: the cpu backend runs it;
//   ref::paged_attention refuses it (InputError); the golden output of fast is the exact convention's, with a
//   bound.out tensor (contract "bound", `fp8ref diff --tol bound`). No unquantized chunk (InputError).
//   Steps: Q̃ = RN_bf16(q) once (|Q̃| < 2^-126 -> ±0); k, v = the code values (exact in bf16; scales folded);
//   acc_j = Σ_d Q̃_d·k_jd (f32, any order, flush-to-zero allowed); t_j = RN32(c2·acc_j),
//   c2 = RN32(RN32(sm_scale·sk)·RN32(log2 e)); online base-2 softmax with an integer running max m2 = ceil(max t)
//   (rescales by 2^(m2 − m2') are exact); P̃_j = RN_bf16(exp2(RN32(t_j − m2))) (Sleef exp2, <= 2^-22 relative), 0
//   where t_j − m2 < −126; L = Σ P̃_j, N_d = Σ P̃_j·v_jd (f32, any order); out = RN_out(RN32(N_d · RN32(sv / L))),
//   0 for a row without visible keys. NaN policy (as exact's IEEE propagation, so a fallback never hides a NaN): a
//   row with a NaN or +Inf logit t_j, or whose visible logits are all −Inf, is NaN in every element (a NaN or ±Inf
//   query, a NaN code in a visible key, e5m2 ±Inf codes); a −Inf logit has weight 0; NaN/Inf V codes propagate
//   through P̃·v (0·Inf = NaN). The vector paths hand a unit whose queries or codes read hold a non-finite value to
//   the portable steps. Paths: AMX (bf16 tiles), AVX-512 BF16 (vdpbf16ps: bf16 pairs into f32, CPUs with
//   AVX512_BF16 and VBMI but no AMX, e.g. AMD Zen 4/5), AVX2 (f32 FMA; e4m3fn codes as value·2^-8, scaled
//   back exactly in c2 and before the final factor — their f32 underflow errors, <= 2^-142 per operation in natural
//   units, sit inside the η terms below), portable (scalar).
//   Soft-cap (cap > 0): t_j = RN32(c_l·τ(RN32(c1'·acc_j))), c1' = RN32(sm_scale·sk / cap) (f64, rounded once),
//   c_l = RN32(cap·log2 e), τ(x) = sign(x)·RN32(RN32(1 − e) / RN32(1 + e)), e = exp2(−RN32(c_t·|x|)) (Sleef exp2; 0
//   below −126), c_t = RN32(2·log2 e); NaN stays NaN. |τ(x) − tanh x| <= ε_τ = 2^-20 (absolute): with E = e^(−2|x|),
//   |e − E| <= 2^-22 + u (exp2's 2^-22, plus the argument's two roundings: E·w·ln 2·(2u + u²) with E·w <= 0.531,
//   w = 2|x|·log2 e),
//   |(1−e)/(1+e) − (1−E)/(1+E)| <= 2|e − E|, and the three f32 operations add <= 4.01u of a value <= 1 (the AVX-512
//   path divides by rcp14 and one Newton step: + 2^-27): 2^-21 + 6.1u + 2^-27 (tests/test_attention_fast.cc measures
//   every 61st f32 in [0, 64], both paths, against the claim). tanh is 1-Lipschitz,
//   so E_l below becomes E_l + cap·(ε_τ + (2u + u²)(1 + ε_τ)) (c_l's and t_j's roundings of a value <= cap·log2 e),
//   and bound_exact_f64 takes the soft-cap term.
//   Bound (u = 2^-24, u' = 2^-23, u_b = 2^-8, u_q = 0 for bf16 q else 2^-8, η = 2^-126, γ'_n = n·u'/(1 − n·u'),
//   per row: n visible keys, A = max_j Σ_d |q_d k_jd|, K1 = max_j Σ_d |k_jd| (code units), κ = (1+u)^4(1+2^-52) − 1):
//     Δacc = u_q·A + η·K1 + γ'_Dk·((1+u_q)·A + η·K1) + Dk·η            (Q̃ rounding/flush, f32 accumulation, FTZ)
//     E_l  = sm_scale·sk·(Δacc·(1+κ) + κ·A) + 2^-149                   (|t_j·ln 2 − l_j|, natural-log units)
//     θ    = e^(E_l + 126·u·ln 2)·(1 + 2^-22)·(1 + u_b) − 1            (per-key relative weight error: logit, z's
//                                                                       rounding, exp2, P̃'s bf16 rounding)
//   The computed weights sum to >= 1/2 (the max key's P̃ >= 1/2), weights below 2^-125 may be dropped, so with
//   range_d = (max_j v_jd − min_j v_jd)·sv and V_d = max_j |v_jd| (codes), per output element d:
//     E_ratio = range_d·(θ·(1 + 2nη')/(1 − θ) + 2nη'),  η' = 2^-125     (a ratio of sums with perturbed weights)
//     E_acc   = sv·(2γ'_n·V_d + 2·(3 + 2V_d)·n·η)/(1 − γ'_n − 8nη)      (N and L in f32, any order, flushes)
//     A_d = |o_d| + E_ratio + E_acc;  E_fin = (2u + u²)·A_d + 2^-148 + n·V_d·2^-149 + u_out·A_d·(1 + 3u) + η_out
//       (n·V_d·2^-149: the factor RN32(sv / L) below f32's normal range — a tiny sv — is off by up to 2^-150
//       absolutely, times N <= n·V_d)
//     |fast − o_d| <= E_ratio + E_acc + E_fin;  against exact's f64 result add bound_exact_f64 (times 1 + 2^-40)
//   (u_out = 2^-8 bf16, 2^-11 f16, 2^-24 f32; η_out = 2^-126 bf16 (room for a conversion that treats f32
//   subnormals as 0; every path now rounds them as RN_bf16 does, tested bit for bit against its own f32 output),
//   2^-25 f16, 2^-150 f32). +Inf (no claim): a non-finite code anywhere in a (sequence, KV head)'s [0, seq_len) K/V,
//   a non-finite or > 3.3e38 query, θ or γ'_n >= 1/4, sm_scale·sk <= 2^-100, an output reaching the format's max.
//   On random data with bf16 queries the bound is ~0.8 % of max|v̂| (tested < 1 %); f16/f32 queries add u_q to
//   the logits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp8ref/format.h"

namespace fp8ref::attn {

enum class KvLayout : uint8_t { nhd, hnd };
enum class KvScaleKind : uint8_t { tensor, head, seq };
enum class StoreConvention : uint8_t { vllm_cuda, sglang, spyre, exact };
enum class AttnConvention : uint8_t { exact, vllm_paged_v1, vllm_triton_unified, flashinfer, torch_sdpa_math, spyre, fast };
enum class Causal : uint8_t { bottom_right, top_left, none };
// flashinfer: which of FlashInfer's kernels a sequence runs (AttnSpec::fi_kernel).
enum class FiKernel : uint8_t { automatic, prefill, decode };

const char* to_string(KvLayout v);          // "nhd", "hnd"
const char* to_string(KvScaleKind v);       // "tensor", "head", "seq"
const char* to_string(StoreConvention v);   // "vllm-cuda", "sglang", "spyre", "exact"
const char* to_string(AttnConvention v);    // "exact", "vllm-paged-v1", ...
const char* to_string(Causal v);            // "bottom-right", "top-left", "none"
const char* to_string(FiKernel v);          // "auto", "prefill", "decode"
bool parse_kv_layout(std::string_view s, KvLayout* out);
bool parse_kv_scale_kind(std::string_view s, KvScaleKind* out);
bool parse_store_convention(std::string_view s, StoreConvention* out);
bool parse_attn_convention(std::string_view s, AttnConvention* out);
bool parse_causal(std::string_view s, Causal* out);
bool parse_fi_kernel(std::string_view s, FiKernel* out);

// The geometry of one cache tensor.
struct CacheShape {
  int64_t num_blocks = 0, block_size = 16, num_kv_heads = 1, head_dim = 128;
  KvLayout layout = KvLayout::nhd;
  Format format = Format::e4m3fn;  // e4m3fn or e5m2

  std::vector<int64_t> shape() const;  // [nb, bs, H, D] (NHD) or [nb, H, bs, D] (HND)
  int64_t numel() const { return num_blocks * block_size * num_kv_heads * head_dim; }
  // Element offset of (block, slot-in-block, head, d = 0).
  int64_t offset(int64_t block, int64_t slot, int64_t head) const {
    return layout == KvLayout::nhd ? ((block * block_size + slot) * num_kv_heads + head) * head_dim
                                   : ((block * num_kv_heads + head) * block_size + slot) * head_dim;
  }
};

// Number of scales of a kind: 1, Hkv or B.
int64_t num_scales(KvScaleKind kind, int64_t num_kv_heads, int64_t num_seqs);
// The scale of sequence `seq` and KV head `kv_head` among them: 0, kv_head or seq.
int64_t scale_index(KvScaleKind kind, int64_t seq, int64_t kv_head);

// ---- kv_cache_write --------------------------------------------------------------------------------------------
struct KvWriteSpec {
  StoreConvention convention = StoreConvention::vllm_cuda;
  Format model = Format::bf16;  // dtype of K and V: f32, bf16, f16
  CacheShape cache;             // K and V caches have the same shape
  KvScaleKind scale_kind = KvScaleKind::tensor;
  bool dynamic = false;         // compute the scales (Spyre rule, above) instead of reading them
};

struct KvWriteArgs {
  int64_t num_tokens = 0;
  const void* k = nullptr;                 // [T, Hkv, D], md bit patterns
  const void* v = nullptr;                 // [T, Hkv, D]
  const int64_t* slot_mapping = nullptr;   // [T]
  int64_t num_seqs = 0;                    // B (scale_kind seq only)
  const int32_t* query_start_loc = nullptr;  // [B+1]: token ranges of the sequences (scale_kind seq only)
  float* k_scale = nullptr;                // [num_scales]: read (static) or written (dynamic)
  float* v_scale = nullptr;
  uint8_t* k_cache = nullptr;              // [cache.numel()], updated in place
  uint8_t* v_cache = nullptr;
};

// Throws InputError naming the problem: formats, slot out of range, query_start_loc not covering [0, T). NaN or
// non-positive static scales are allowed here (they propagate); the CLI refuses them (a scale must be positive and
// finite) — only shapes and indices are checked here.
void check_kv_cache_write(const KvWriteSpec& spec, const KvWriteArgs& args);

// ---- paged_attention -------------------------------------------------------------------------------------------
struct AttnSpec {
  AttnConvention convention = AttnConvention::vllm_triton_unified;
  Format q_format = Format::bf16;    // md: f32, bf16, f16
  Format out_format = Format::bf16;  // f32, bf16, f16; e4m3fn with out_scale (vllm-triton-unified)
  CacheShape cache;                  // the K cache; head_dim = Dk
  int64_t head_dim_v = 0;            // Dv (0: = Dk)
  bool v_from_k = false;             // MLA: V = K cache[..., :Dv]
  int64_t num_q_heads = 8;
  double sm_scale = 0;               // <= 0: 1/sqrt(Dk)
  Causal causal = Causal::bottom_right;
  int64_t window_left = -1;          // < 0: no sliding window
  double softcap = 0;                // <= 0: none
  KvScaleKind scale_kind = KvScaleKind::tensor;
  int torch_lanes = 16;              // torch-sdpa-math / spyre: Vectorized<float> lanes (16 AVX512, 8 AVX2)
  // vllm-triton-unified / flashinfer: keys per online-softmax tile, [tile·t, tile·t + tile) of the sequence; a
  // multiple of 16 in [16, 256], or 0 for the convention's own: flashinfer 16; vllm-triton-unified 32 in one pass
  // (TILE_SIZE_PREFILL of vLLM's 2D kernel), 16 with segments (TILE_SIZE_DECODE of its 3D kernel). Other
  // conventions refuse any value but 0.
  int64_t tile = 0;
  // vllm-triton-unified: 0 = one online pass per row (vLLM's 2D kernel); S = a power of two in [2, 64]: vLLM's 3D
  // decode kernel with S segments (vLLM: 16), each an online pass over cdiv(seq_len, S·T) tiles, merged as its
  // reduce_segments does (below); −1 (the default) = as vLLM picks per batch: the 3D kernel with 16 segments when
  // every sequence has at most one query token and (T / BLOCK_Q + num_seqs)·Hkv <= 128 (BLOCK_M = 16 for
  // G = Hq/Hkv <= 16, else the power of two >= G; BLOCK_Q = BLOCK_M / G), else the 2D kernel. Other conventions
  // refuse any value but −1.
  int64_t segments = -1;
  // flashinfer: keys per split-KV chunk (FlashInfer's partition_kv; the steps under "flashinfer" above): 0 = one
  // online pass per row; N > 0 = chunks [N·c, N·c + N) of the sequence, each its own pass, merged as FlashInfer's
  // VariableLengthMergeStates does; −1 (the default) = as FlashInfer 0.7.4's DecodePlan chooses on a 132-SM Hopper
  // (H100/H200; flashinfer_plan_chunk). Other conventions refuse any value but −1.
  int64_t kv_chunk = -1;
  // flashinfer: the kernel a sequence runs. automatic ("auto", the default): a sequence of more than one query token
  // FlashInfer's tensor-core batch prefill kernel (the steps under "flashinfer prefill" above) where that kernel exists
  // (flashinfer_prefill_supported), every other sequence the CUDA-core decode kernel's steps (vLLM's FlashInfer backend
  // sends decode tokens to the decode wrapper); prefill: every sequence the prefill kernel (one
  // BatchPrefillWithPagedKVCacheWrapper call over the batch; refused where it does not exist); decode: every row the
  // decode kernel's steps (fp8ref <= 0.5.0 for prefill rows too). Other conventions refuse any value but automatic.
  FiKernel fi_kernel = FiKernel::automatic;
  // flashinfer prefill kernel: packed query rows (q_len·G) per CTA, 16, 64 or 128 (not 128 for head dim 256); it sets
  // the keys per warp tile and the KV warps (flashinfer_prefill_tile). 0 (the default): as FlashInfer's plan picks.
  int64_t cta_tile_q = 0;
  // flashinfer prefill kernel: keys per split-KV chunk (0: none; N > 0: chunks of N keys from the row's KV start,
  // merged as FlashInfer merges them); −1 (the default): as FlashInfer 0.7.4's PrefillPlan picks on a 132-SM Hopper.
  int64_t prefill_kv_chunk = -1;
  // Chunked prefill reading the chunk's own K/V unquantized (vLLM prefix_prefill, Spyre's non-chunked prefill;
  // pac c.2, c.3.3): keys at positions >= seq_len − q_len take their values from AttnArgs::k_new / v_new (md values,
  // used as they are: no scale, no rounding) instead of the cache; the convention's other steps are unchanged.
  // Not with flashinfer (its K scale lives in sm_scale).
  bool chunk_unquantized = false;
  // vllm-triton-unified: vLLM's fused output quantization (unified_attention's output_scale, USE_FP8): out_format
  // e4m3fn and out_scale > 0 (finite): each output o (f32, before any rounding) is stored as the e4m3fn code of
  // clamp(RN32(o·RN32(1/out_scale)), −448, 448) (tl.clamp: a NaN o gives +448, measured), RNE (Triton's satfinite
  // cast; −0 stays 0x80). Measured: tests/data/h200/vllm_unified_attention_fp8out.npz.
  // 0: none (other conventions refuse any other value, and every convention refuses an fp8 out_format without it).
  double out_scale = 0;

  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : cache.head_dim; }
  double scale() const;              // sm_scale or 1/sqrt(Dk)
  int64_t tile_keys() const;         // tile, or the convention's default (above) for these (resolved) segments
};

struct PageTable {
  // dense form
  const int32_t* block_table = nullptr;  // [B, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* seq_lens = nullptr;     // [B]
  // CSR form (used when indptr != nullptr)
  const int32_t* indptr = nullptr;       // [B+1]
  const int32_t* indices = nullptr;      // [num_indices]
  int64_t num_indices = 0;
  const int32_t* last_page_len = nullptr;  // [B]
};

struct AttnArgs {
  int64_t num_seqs = 0, num_tokens = 0;
  const void* q = nullptr;                   // [Tq, Hq, Dk] md bits
  const int32_t* query_start_loc = nullptr;  // [B+1]
  PageTable table;
  const uint8_t* k_cache = nullptr;
  const uint8_t* v_cache = nullptr;          // ignored with v_from_k
  const float* k_scale = nullptr;            // [num_scales]
  const float* v_scale = nullptr;            // ignored with v_from_k (the K scale is used)
  void* out = nullptr;                       // [Tq, Hq, Dv] out_format
  const void* k_new = nullptr;               // chunk_unquantized: [Tq, Hkv, Dk] md, the query rows' own keys
  const void* v_new = nullptr;               // chunk_unquantized: [Tq, Hkv, Dv] md (ignored with v_from_k: k_new)
};

// One sequence resolved from either table form.
struct SeqPages {
  const int32_t* pages = nullptr;  // page ids in order
  int64_t num_pages = 0;
  int64_t seq_len = 0;
  int64_t q_begin = 0, q_len = 0;
};
SeqPages seq_pages(const AttnSpec& spec, const AttnArgs& args, int64_t b);

// Throws InputError naming the problem: Hq not a multiple of Hkv, formats, Dv > Dk with v_from_k, table entries a
// sequence needs pointing past the cache or negative, seq_len longer than its table covers, query_start_loc or indptr
// malformed, last_page_len out of [1, bs], q_len > seq_len, soft-cap under a convention without one, torch lanes
// other than 8/16. Array lengths are the caller's (the CLI and the golden op check them against B and T).
void check_paged_attention(const AttnSpec& spec, const AttnArgs& args);
// The spec with the launch resolved for this batch (after check_paged_attention): vllm-triton-unified's segments −1
// replaced by vLLM's choice (AttnSpec::segments), flashinfer's kv_chunk −1 by flashinfer_plan_chunk; other specs
// unchanged. Both backends run the resolved spec.
AttnSpec resolve_launch(const AttnSpec& spec, const AttnArgs& args);
// flashinfer: whether FlashInfer's tensor-core prefill kernel exists for this spec's shapes and formats: Dk = Dv in
// {64, 128, 256}, md (q) bf16 or f16, no MLA (v_from_k), no soft-cap.
bool flashinfer_prefill_supported(const AttnSpec& spec);
// flashinfer: whether sequence s runs the prefill kernel under spec.fi_kernel (false for other conventions).
bool flashinfer_takes_prefill(const AttnSpec& spec, const SeqPages& s);
// flashinfer prefill kernel: keys per warp tile T (NUM_MMA_KV·16) and KV warps (NUM_WARPS_KV) of the kernel that
// FlashInfer 0.7.4 dispatches for head dim d (64, 128, 256) and cta_tile_q on an H100/H200 (e4m3 cache, bf16 q;
// from its shared-memory budget): {64: 16 -> 128 x 4, 64 -> 128 x 1, 128 -> 64 x 1; 128: 16 -> 64 x 4, 64 -> 128 x 1,
// 128 -> 64 x 1; 256: 16 -> 32 x 4, 64 -> 64 x 1}. Returns T (0: no such kernel) and sets *warps.
int64_t flashinfer_prefill_tile(int64_t d, int64_t cta_tile_q, int64_t* warps);
// flashinfer prefill kernel: FlashInfer 0.7.4's PrefillPlan over the sequences that run it (scheduler.cuh
// PrefillSplitQOKVIndptr, eager mode, 132 SMs): cta_tile_q from the mean packed query length (integer mean of
// q_len·G: > 64 and Dv < 256 -> 128, > 16 -> 64, else 16); split-KV when the CTAs (Σ cdiv(q_len·G, cta_tile_q) ·
// chunks) would exceed 264 / Hkv with one chunk a sequence: then the fewest pages per chunk, at least
// max(128 / page, 1), that keeps them within it (binary search over pages; a sliding window counts
// min(cdiv(window + cta_tile_q, page), pages) pages). Sets *cta_tile_q and *chunk (keys; 0 = no split).
void flashinfer_prefill_plan(const AttnSpec& spec, const AttnArgs& args, int64_t* cta_tile_q, int64_t* chunk);
// flashinfer: the split-KV chunk (keys; 0 = none) FlashInfer 0.7.4's DecodePlan picks for this batch on a 132-SM
// Hopper for the sequences that run the decode kernel (flashinfer_takes_prefill false) — its work estimation with
// the max_grid_size (blocks per SM by occupancy × SMs) it computed on an H100 for the e4m3/bf16 CUDA-core decode
// kernel (Dk = Dv in {64, 128, 256}, G in {1, 2, 3, 4, 6, 8, 16}; else 0): none when one of them has more than one
// query token (fi_kernel decode) or their count·Hkv >= max_grid_size; else the fewest pages per chunk, at least
// max(128 / page, 1), with Σ_b cdiv(pages_b, n)·Hkv <= max_grid_size, and none if that leaves one chunk per sequence.
int64_t flashinfer_plan_chunk(const AttnSpec& spec, const AttnArgs& args);
// vllm-triton-unified (a resolved spec): whether vLLM's kernel starts query row i (0-based in a sequence of seq_len
// keys and q_len queries; visible keys [lo, hi]) from M = 0, L = 0 instead of M = −inf, L = 1 — in its one pass
// (segment < 0: the 2D kernel) or in segment `segment` of the 3D kernel. That is so when the first tile the kernel
// walks there holds none of the row's visible keys: its where(m_j > −inf, m_j, 0) guard sets M = 0 (and L, acc = 0).
// The 2D kernel walks the tiles of the row's q block (BLOCK_Q rows): with a sliding window from the tile of the
// block's first allowed key; the 3D kernel walks tiles [s·tps, (s+1)·tps) up to the block's causal end.
bool triton_starts_at_zero(const AttnSpec& spec, int64_t seq_len, int64_t q_len, int64_t i, int64_t lo, int64_t hi,
                           int64_t segment);
// vllm-triton-unified: whether its two tl.dot products run on the tensor cores as modelled, i.e. md is bf16 or f16
// (HMMA.16816.F32: fp8ref::ref::hmma16_dot_kw4, include/fp8ref/mma.h). An f32 md (TF32 in Triton, not measured) keeps
// f32 FMAs in order.
inline bool triton_tensor_cores(Format md) { return md == Format::bf16 || md == Format::f16; }

// The derived bound of the exact convention's f64 path (see "exact" above) for one output element.
double bound_exact_f64(int64_t dk, int64_t n_keys, double sm_scale, double max_abs_qk_sum, double max_abs_v,
                       double softcap);

namespace ref {
// Scalar, single-threaded, steps exactly as listed above (reference/attention_ref.cc).
void kv_cache_write(const KvWriteSpec& spec, const KvWriteArgs& args);
// The dynamic scale of one group (the Spyre rule above) from its amax (NaN: the group held a NaN).
float kv_dynamic_scale(Format md, float amax, float range);
// exact_out: optional [Tq, Hq, Dv] f64 — the exact convention's unrounded f64 result (any convention's spec: the
// exact path is run for it).
void paged_attention(const AttnSpec& spec, const AttnArgs& args, double* exact_out = nullptr);
// HMMA.16816 steps for several outputs at once, as cpu::hmma16_lanes states them (c[l] for lanes l in [l0, l1) of
// `lanes`); the flashinfer prefill kernel's QK and P·V steps take it. fn null: ref::hmma16_step lane by lane.
struct HmmaLanes {
  void (*fn)(Format f, const float* a, int n, int k_lo, int k_hi, const float* b, ptrdiff_t row0, size_t stride,
             float* c, size_t l0, size_t l1) = nullptr;
  size_t lanes = 1;
};
// One (sequence, q head): writes the q_len rows of out for q head h. The unit both backends share for exact and
// for flashinfer's prefill kernel (the cpu backend with its SIMD steps as `hmma`).
void paged_attention_head(const AttnSpec& spec, const AttnArgs& args, int64_t b, int64_t h, double* exact_out,
                          HmmaLanes hmma = {});
// The exp models (documented above). NaN -> NaN, x < −104 (exp) / x < −150 (exp2) -> +0.
float exp_sleef(float x);
float exp2_sleef(float x);
// flashinfer's split-KV merge (the steps above, from the chunks' passes on): the nc chunks' states o[nc·dv] (unnormalized),
// m[nc] (−inf: the chunk saw no key), d[nc] -> out[dv] (f32, before the output rounding). Shared by both backends.
void flashinfer_merge_chunks(const float* o, const float* m, const float* d, int64_t nc, int64_t dv, Format out_format,
                             float* out);
// MUFU.RCP (PTX rcp.approx.ftz.f32) of a normal y > 0 whose reciprocal is normal (FlashInfer's d >= 1): T(m)·2^(127−e)
// from the table captured on the GPU (triton_div.h).
float mufu_rcp(float y);
// vllm-triton-unified's f32 steps between its dots, as Triton 3.6 builds them on NVIDIA (shared by both backends):
// apply_softcap with tl.exp (ref::triton_exp) and Triton's division (ref::triton_nv_div); and l_j = tl.sum(P, axis=1)
// over a tile of T keys (T = 16, 32: measured, tests/data/h200/triton_rowsum.npz) in the MMAv2 layout of 4 warps:
// thread q of n8 tile t holds columns 8t + 2q, 8t + 2q + 1 (tiles t, t + 4, … in one warp, summed in that order);
// lanes by shfl.bfly 2 then 1 — W_t = ((x0 + x1) + (x4 + x5)) + ((x2 + x3) + (x6 + x7)) — and the warps likewise:
// T = 16: W0 + W1; T = 32: (W0 + W2) + (W1 + W3).
float triton_softcap(float s, float cap);
// vLLM's fused output quantization (AttnSpec::out_scale): the e4m3fn code of output o with inv = RN32(1/out_scale).
uint8_t triton_fp8_out(float o, float inv);
float triton_row_sum(const float* p, int64_t T);
// vllm-triton-unified's reduce_segments (above): the S segment states (M[S], L[S], acc[S·dv], slots >= act ignored)
// -> out[dv] (f32, before the output rounding). Shared by both backends. num_d's order: reduce_segments' [S, Dpad]
// tile (Dpad = dv rounded up to a power of two) in Triton's blocked layout of 4 warps, 4 dims a thread: td =
// min(32, Dpad/4) lanes along the dims and tr = 32/td along the segments, wd = min(4, Dpad/(4·td)) warps along the
// dims and wr = 4/wd along the segments; thread (w, l) adds segments k·tr·wr + w·tr + l in increasing k, then the
// lanes and then the warps pairwise, halving (measured for D = 32, 64, 128, 256: tests/data/h200/triton_segsum/).
void triton_reduce_segments(const float* M, const float* L, const float* acc, int64_t S, int64_t act, int64_t dv,
                            float* out);
}  // namespace ref

namespace cpu {
// OpenMP over (sequence, chunk of 4 query positions), Highway inner loops (src/cpu/attention_cpu.cc); bit-identical
// to ref:: per convention. Convention fast runs src/cpu/attention_fast.cc (AMX, AVX-512 BF16 or AVX2; within its bound of exact); the exact
// convention runs ref's f64 path per (sequence, head) in parallel. kv_cache_write: every convention vectorised over
// blocks of tokens (vllm-cuda through the vector group quantizer cpu::quantize_static; sglang/spyre: the md quotient in
// vector lanes, then the vector torch cast; exact: the f64 quotient, then the vector exact cast), dynamic scales from
// vector row maxima; rows copied to their slots in token order.
void kv_cache_write(const KvWriteSpec& spec, const KvWriteArgs& args);
void paged_attention(const AttnSpec& spec, const AttnArgs& args);
// Convention fast's bound (above), per output element [Tq, Hq, Dv]: |fast − exact_f64| <= bound, exact_f64 =
// ref::paged_attention's exact_out (the exact convention before its output rounding); +Inf where no claim is made (a
// non-finite code in a (sequence, KV head)'s [0, seq_len), a non-finite query, an overflowing output). Scalar f64:
// check a fast result, or write a golden file's bound.
void paged_attention_fast_bound(const AttnSpec& spec, const AttnArgs& args, double* bound);
// The SIMD twin of ref::exp_sleef / exp2_sleef over an array (for the tests).
void exp_sleef(const float* x, float* y, size_t n);
void exp2_sleef(const float* x, float* y, size_t n);
// vllm-triton-unified's tensor-core step in the dispatched target's lanes (for the tests): for lanes l in [l0, l1)
// of the first float_lanes() (<= 16), c[l] = ref::hmma16_step(f, a', B_l, n, c[l]) with a'[k] = a[k] and B_l[k] =
// b[(row0 + k)·stride + l] for k in [k_lo, k_hi), both 0 elsewhere (b not read there). c holds float_lanes() values.
void hmma16_lanes(Format f, const float* a, int n, int k_lo, int k_hi, const float* b, ptrdiff_t row0, size_t stride,
                  float* c, size_t l0, size_t l1);
size_t float_lanes();
}  // namespace cpu

}  // namespace fp8ref::attn
