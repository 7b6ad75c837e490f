# H200 capture for fp8ref's quant conventions: DeepGEMM per_token_cast_to_fp8 (torch, CUDA), DeepSeek-V3
# act_quant_kernel (Triton, verbatim HEAD math), sglang _per_token_group_quant_8bit (Triton, from research §3.1),
# and the torch CUDA `tensor / python_scalar` rounding. Writes $OUT/capture.npz.
import os, sys, numpy as np, torch, triton, triton.language as tl
out = os.environ["OUT"]
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
rng = np.random.default_rng(2026)
M, K = 256, 512
x = rng.standard_normal((M, K)) * np.exp2(rng.integers(-30, 30, size=(M, 1)))
x[0] = 0; x[1] = -0.0; x[2] *= 1e-12; x[3] = rng.standard_normal(K) * 1e-6
x[4, 5] = np.nan; x[5, 130] = np.inf; x[6, 7] = -np.inf; x[6, 200] = np.nan
x[7, ::2], x[7, 1::2] = 448.0, -448.0
x[8, 0] = 448.0 * 2.0**-5 * (1 + 2.0**-7); x[9, 0] = 448.0 * 8
x[9, 1:] = rng.integers(-448, 449, size=K - 1) * 4.0
x[10] = rng.standard_normal(K) * np.exp2(rng.integers(-30, 30, size=K))
xt = torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).cuda()
res = {"x_bf16": xt.view(torch.int16).cpu().numpy().view(np.uint16)}

def ceil_to_ue8m0(x):
    bits = x.abs().float().view(torch.int)
    exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exp.clamp(1, 254) << 23).view(torch.float)

def per_token_cast_to_fp8(x, use_ue8m0, gran_k=128):  # DeepGEMM deep_gemm/utils/math.py
    m, n = x.shape
    padded_n = (n + gran_k - 1) // gran_k * gran_k
    x_padded = torch.empty((m, padded_n), dtype=x.dtype, device=x.device).fill_(0)
    x_padded[:, :n] = x
    x_view = x_padded.view(m, padded_n // gran_k, gran_k)
    x_amax = x_view.abs().float().amax(dim=2).view(m, padded_n // gran_k).clamp(1e-4)
    sf = x_amax / 448.0
    sf = ceil_to_ue8m0(sf) if use_ue8m0 else sf
    x_fp8 = (x_view * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, padded_n)[:, :n].contiguous()
    return x_fp8, sf

for u in (False, True):
    for n in (K, 300):
        q, sf = per_token_cast_to_fp8(xt[:, :n].contiguous(), u)
        res[f"deepgemm_{int(u)}_{n}_q"] = q.view(torch.uint8).cpu().numpy()
        res[f"deepgemm_{int(u)}_{n}_s"] = sf.cpu().numpy()

@triton.jit
def act_quant_kernel(x_ptr, y_ptr, s_ptr, BLOCK_SIZE: tl.constexpr, scale_fmt: tl.constexpr):  # DeepSeek-V3 HEAD
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offs).to(tl.float32)
    amax = tl.max(tl.abs(x))
    amax = tl.maximum(amax, 1e-4)
    s = amax / 448.
    if scale_fmt == "ue8m0":
        exp = tl.math.ceil(tl.math.log2(s))
        s = tl.math.exp2(exp)
    y = x / s
    y = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs, y)
    tl.store(s_ptr + pid, s)

for fmt in ("none", "ue8m0"):
    y = torch.empty_like(xt, dtype=torch.float8_e4m3fn)
    s = torch.empty(M, K // 128, dtype=torch.float32, device="cuda")
    act_quant_kernel[(xt.numel() // 128,)](xt, y, s, BLOCK_SIZE=128, scale_fmt=fmt)
    res[f"deepseek_{fmt}_q"] = y.view(torch.uint8).cpu().numpy(); res[f"deepseek_{fmt}_s"] = s.cpu().numpy()

@triton.jit
def sglang_group_quant(y_ptr, y_q_ptr, y_s_ptr, group_size, eps, fp8_min, fp8_max, BLOCK: tl.constexpr):
    g_id = tl.program_id(0)
    y_ptr += g_id * group_size; y_q_ptr += g_id * group_size; y_s_ptr += g_id
    cols = tl.arange(0, BLOCK); mask = cols < group_size
    y = tl.load(y_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    _absmax = tl.maximum(tl.max(tl.abs(y)), eps)
    y_s = _absmax / fp8_max
    y_s_inv = 1.0 / y_s
    y_q = tl.clamp(y * y_s_inv, fp8_min, fp8_max).to(y_q_ptr.dtype.element_ty)
    tl.store(y_q_ptr + cols, y_q, mask=mask); tl.store(y_s_ptr, y_s)

yq = torch.empty_like(xt, dtype=torch.float8_e4m3fn)
ys = torch.empty(M, K // 128, dtype=torch.float32, device="cuda")
sglang_group_quant[(xt.numel() // 128,)](xt, yq, ys, 128, 1e-10, -448.0, 448.0, BLOCK=128)
res["sglang_q"] = yq.view(torch.uint8).cpu().numpy(); res["sglang_s"] = ys.cpu().numpy()

a = torch.rand(1 << 22, device="cuda", dtype=torch.float32) * 1000
d1 = (a / 448.0).cpu().numpy(); an = a.cpu().numpy()
print("tensor/448.0 == a*RN(1/448):", np.mean(d1 == an * np.float32(1 / 448.0)), " == RN(a/448):", np.mean(d1 == (an.astype(np.float64) / 448).astype(np.float32)))
t448 = torch.full_like(a, 448.0)
d2 = (a / t448).cpu().numpy()
print("tensor/tensor == RN(a/448):", np.mean(d2 == (an.astype(np.float64) / 448).astype(np.float32)))
np.savez(os.path.join(out, "capture.npz"), **res)
print("saved", len(res))
