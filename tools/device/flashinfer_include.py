"""FlashInfer's include/ directory prepared for fp8ref's FlashInfer capture harnesses (capture_flashinfer_decode.py,
capture_flashinfer_prefill.py). FlashInfer is not part of fp8ref: the harnesses take the include/ directory of a
release (the flashinfer-python wheel's flashinfer/data/include) as their first argument."""
import os
import shutil
import sys
import tempfile


def prepared_include(inc, header):
    """A temporary copy of FlashInfer's include/ directory `inc` (exits with a message unless it holds
    flashinfer/attention/<header>) with one adaptation to CUDA 13.0: FlashInfer 0.7.4's fastdiv.cuh wraps
    cuda::fast_mod_div, which 13.0's CCCL lacks, so the copy divides with plain integer / and % (the same quotients:
    page, slot and head indices only). Returns (a scratch directory, the copy's include path)."""
    if not os.path.isfile(os.path.join(inc, "flashinfer", "attention", header)):
        sys.exit(f"give the include/ directory of a FlashInfer release (with flashinfer/attention/{header})")
    work = tempfile.mkdtemp()
    src_inc = os.path.join(work, "include")
    shutil.copytree(inc, src_inc)
    fd = os.path.join(src_inc, "flashinfer", "fastdiv.cuh")
    text = open(fd).read()
    if "cuda::fast_mod_div<uint32_t> impl_;" in text:
        open(fd, "w").write(text.replace("cuda::fast_mod_div<uint32_t> impl_;", "uint32_t impl_;"))
    return work, src_inc
