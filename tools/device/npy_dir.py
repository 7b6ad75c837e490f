"""Writes a capture as a directory of .npy files under $OUT (the C++ tests read .npy, not .npz). The device tool
returns at most 8 files a run: tar such a directory on the device (tools/device/README.md)."""
import os

import numpy as np


def save_npy_dir(name, arrays, text=None):
    """$OUT/<name>/<key>.npy for every key of `arrays` (and meta.txt holding `text`); prints and returns the path."""
    dst = os.path.join(os.environ.get("OUT", "."), name)
    os.makedirs(dst, exist_ok=True)
    for key, a in arrays.items():
        np.save(os.path.join(dst, key + ".npy"), a)
    if text is not None:
        with open(os.path.join(dst, "meta.txt"), "w") as f:
            f.write(text + "\n")
    print("wrote", dst, sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst)), "bytes")
    return dst
