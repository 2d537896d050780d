#!/usr/bin/env python3
"""cuda_fatbin.py: the GPU image's kernel fatbin, built by CUDA 12.4's own compiler.

The GPU image's driver (550) runs code of CUDA 12.4 at most: PTX ISA 8.4, SASS up to sm_90.
PyPI has no 12.4 nvcc (its nvidia-cuda-nvcc-cu12 12.4 wheel holds only ptxas and libnvvm),
but it has the 12.4 runtime compiler and fatbin writer as libraries:

  NVRTC 12.4 (nvidia-cuda-nvrtc-cu12)     cuda/kernels.cu -> SASS (cubin) per sm_XY, PTX for compute_XY
  nvFatbin 12.4 (nvidia-nvfatbin-cu12)    those images -> one fatbin, the container nvcc -fatbin makes
  cuda_fp16.h, cuda_fp8.h (nvidia-cuda-runtime-cu12, include/)

This script drives the two libraries through ctypes (no compiler of ours is involved) and
checks what it made before writing it: every PTX `.version` at most --max-ptx, every SASS
architecture at most --max-sm (the levels the Makefile derives from the pinned driver,
image/gpu/driver.env), the NVRTC and nvFatbin versions the ones asked for (--cuda).

  cuda_fatbin.py --wheels DIR --src cuda/kernels.cu -I . --sass 80,86,89,90 --ptx 90 \
      --cuda 12.4 --max-ptx 8.4 --max-sm 90 -o build/cuda124/kernels.fatbin

Exit 0 written, 1 a check failed or a compile error (said on stderr), 2 usage.
"""
import argparse
import ctypes
import os
import re
import sys


def die(msg):
    print(f"cuda_fatbin: error: {msg}", file=sys.stderr)
    sys.exit(1)


def ver_tuple(s):
    m = re.fullmatch(r"(\d+)\.(\d+)", s)
    if not m:
        raise argparse.ArgumentTypeError(f"'{s}' is not MAJOR.MINOR")
    return (int(m.group(1)), int(m.group(2)))


def arch_list(s):
    out = []
    for a in s.split(","):
        if not re.fullmatch(r"\d{2,3}", a):
            raise argparse.ArgumentTypeError(f"'{a}' is not an architecture number such as 90")
        out.append(int(a))
    return out


class Nvrtc:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        P, c_p, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        L.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int)] * 2
        L.nvrtcCreateProgram.argtypes = [ctypes.POINTER(P), c_p, c_p, ctypes.c_int,
                                         ctypes.POINTER(c_p), ctypes.POINTER(c_p)]
        L.nvrtcCompileProgram.argtypes = [P, ctypes.c_int, ctypes.POINTER(c_p)]
        L.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(P)]
        for n in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
            getattr(L, n).argtypes = [P, ctypes.POINTER(sz)]
        for n in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
            getattr(L, n).argtypes = [P, ctypes.c_char_p]
        L.nvrtcGetErrorString.restype = c_p
        L.nvrtcGetErrorString.argtypes = [ctypes.c_int]

    def version(self):
        a, b = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
        return (a.value, b.value)

    def _get(self, prog, size_fn, get_fn):
        n = ctypes.c_size_t()
        r = size_fn(prog, ctypes.byref(n))
        if r:
            return None
        buf = ctypes.create_string_buffer(n.value)
        if get_fn(prog, buf):
            return None
        return buf.raw[:n.value]

    def compile(self, src, name, opts):
        """(ok, log, ptx or None, cubin or None) for one compile of src with opts."""
        L = self.lib
        prog = ctypes.c_void_p()
        r = L.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None)
        if r:
            die(f"nvrtcCreateProgram: {L.nvrtcGetErrorString(r).decode()}")
        try:
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            r = L.nvrtcCompileProgram(prog, len(opts), arr)
            log = self._get(prog, L.nvrtcGetProgramLogSize, L.nvrtcGetProgramLog) or b""
            log = log.rstrip(b"\0").decode(errors="replace")
            if r:
                return False, f"{L.nvrtcGetErrorString(r).decode()}\n{log}", None, None
            ptx = self._get(prog, L.nvrtcGetPTXSize, L.nvrtcGetPTX)
            cubin = self._get(prog, L.nvrtcGetCUBINSize, L.nvrtcGetCUBIN)
            return True, log, ptx, cubin
        finally:
            L.nvrtcDestroyProgram(ctypes.byref(prog))


class Fatbin:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        P, sz, c_p = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        L.nvFatbinVersion.argtypes = [ctypes.POINTER(ctypes.c_uint)] * 2
        L.nvFatbinCreate.argtypes = [ctypes.POINTER(P), ctypes.POINTER(c_p), sz]
        L.nvFatbinAddPTX.argtypes = [P, c_p, sz, c_p, c_p, c_p]
        L.nvFatbinAddCubin.argtypes = [P, c_p, sz, c_p, c_p]
        L.nvFatbinSize.argtypes = [P, ctypes.POINTER(sz)]
        L.nvFatbinGet.argtypes = [P, ctypes.c_void_p]
        L.nvFatbinDestroy.argtypes = [ctypes.POINTER(P)]
        L.nvFatbinGetErrorString.restype = c_p
        L.nvFatbinGetErrorString.argtypes = [ctypes.c_int]
        self.h = ctypes.c_void_p()

    def version(self):
        a, b = ctypes.c_uint(), ctypes.c_uint()
        self.lib.nvFatbinVersion(ctypes.byref(a), ctypes.byref(b))
        return (a.value, b.value)

    def check(self, r, what):
        if r:
            die(f"{what}: {self.lib.nvFatbinGetErrorString(r).decode()}")

    def build(self, cubins, ptxs):
        L = self.lib
        # Uncompressed, so the PTX text stays readable in the container for the check
        # below (and for anyone with `strings`); the fatbin is ~1 MB either way.
        opts = (ctypes.c_char_p * 1)(b"-compress=false")
        self.check(L.nvFatbinCreate(ctypes.byref(self.h), opts, 1), "nvFatbinCreate")
        try:
            for sm, data in cubins:
                self.check(L.nvFatbinAddCubin(self.h, data, len(data), str(sm).encode(), b"kernels"),
                           f"nvFatbinAddCubin sm_{sm}")
            for sm, data in ptxs:
                # nvFatbin wants the text with its terminating NUL counted.
                text = data if data.endswith(b"\0") else data + b"\0"
                self.check(L.nvFatbinAddPTX(self.h, text, len(text), str(sm).encode(), b"kernels", b""),
                           f"nvFatbinAddPTX compute_{sm}")
            n = ctypes.c_size_t()
            self.check(L.nvFatbinSize(self.h, ctypes.byref(n)), "nvFatbinSize")
            buf = ctypes.create_string_buffer(n.value)
            self.check(L.nvFatbinGet(self.h, buf), "nvFatbinGet")
            return buf.raw[:n.value]
        finally:
            L.nvFatbinDestroy(ctypes.byref(self.h))


PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)\s*$", re.M)
PTX_TARGET = re.compile(rb"^\s*\.target\s+sm_(\d+)", re.M)


def ptx_version(ptx, what):
    m = PTX_VERSION.findall(ptx)
    if len(m) != 1:
        die(f"{what}: expected one .version line in the PTX, found {len(m)}")
    return (int(m[0][0]), int(m[0][1]))


def cubin_sm(cubin, what):
    """The SASS architecture an ELF cubin is for (e_flags' low byte, EF_CUDA_SM)."""
    if cubin[:4] != b"\x7fELF" or len(cubin) < 52:
        die(f"{what}: not an ELF cubin")
    if cubin[4] != 2:
        die(f"{what}: not a 64-bit ELF")
    e_flags = int.from_bytes(cubin[48:52], "little")
    # EF_CUDA_SM: bits 0..7 before the ABI v8 ELFs of CUDA 13, bits 8..15 in them.
    abiv = cubin[8]
    return (e_flags >> 8) & 0xff if abiv >= 8 else e_flags & 0xff


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", required=True, help="the folder pip installed the wheels into (image/gpu/cuda-wheels.txt)")
    ap.add_argument("--src", required=True)
    ap.add_argument("-I", dest="inc", action="append", default=[])
    ap.add_argument("--sass", type=arch_list, required=True)
    ap.add_argument("--ptx", type=arch_list, required=True)
    ap.add_argument("--cuda", type=ver_tuple, required=True, help="the NVRTC/nvFatbin version to insist on")
    ap.add_argument("--max-ptx", type=ver_tuple, required=True)
    ap.add_argument("--max-sm", type=int, required=True)
    ap.add_argument("-o", dest="out", required=True)
    try:
        a = ap.parse_args()
    except SystemExit as e:
        sys.exit(2 if e.code else 0)

    base = os.path.join(a.wheels, "nvidia")
    nvrtc = Nvrtc(os.path.join(base, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    fb = Fatbin(os.path.join(base, "nvfatbin", "lib", "libnvfatbin.so.12"))
    if nvrtc.version() != a.cuda:
        die(f"NVRTC is {nvrtc.version()}, not CUDA {a.cuda}")
    if fb.version() != a.cuda:
        die(f"nvFatbin is {fb.version()}, not CUDA {a.cuda}")
    rt_inc = os.path.join(base, "cuda_runtime", "include")
    if not os.path.isfile(os.path.join(rt_inc, "cuda_fp16.h")):
        die(f"no cuda_fp16.h in {rt_inc}")
    with open(a.src, "rb") as f:
        src = f.read()
    common = ["-std=c++17", f"-I{rt_inc}"] + [f"-I{d}" for d in a.inc]
    # nvcc -O3 for the device means ptxas -O3, which is NVRTC's default.

    cubins, ptxs = [], []
    # PTX first: the one whose level is most often wrong, and the cheaper compile.
    for sm in a.ptx:
        if sm > a.max_sm:
            die(f"PTX compute_{sm} is newer than the driver runs (compute_{a.max_sm} at most)")
        ok, log, ptx, _ = nvrtc.compile(src, os.path.basename(a.src), common + [f"-arch=compute_{sm}"])
        if not ok:
            die(f"{a.src} for compute_{sm}:\n{log}")
        v = ptx_version(ptx, f"compute_{sm}")
        if v > a.max_ptx:
            die(f"compute_{sm} PTX is ISA {v[0]}.{v[1]}, the driver reads {a.max_ptx[0]}.{a.max_ptx[1]} at most")
        ptxs.append((sm, ptx.rstrip(b"\0")))

    for sm in a.sass:
        if sm > a.max_sm:
            die(f"SASS sm_{sm} is newer than the driver runs (sm_{a.max_sm} at most)")
        ok, log, ptx, cubin = nvrtc.compile(src, os.path.basename(a.src), common + [f"-arch=sm_{sm}"])
        if not ok:
            die(f"{a.src} for sm_{sm}:\n{log}")
        if not cubin:
            die(f"NVRTC gave no cubin for sm_{sm}")
        got = cubin_sm(cubin, f"sm_{sm} cubin")
        if got != sm:
            die(f"the sm_{sm} cubin says it is for sm_{got}")
        cubins.append((sm, cubin))
    blob = fb.build(cubins, ptxs)
    # The check again on what will be embedded: every PTX in the container.
    found = PTX_VERSION.findall(blob)
    if len(found) != len(ptxs):
        die(f"the fatbin holds {len(found)} readable PTX .version lines, {len(ptxs)} PTX images were added")
    for mj, mn in found:
        if (int(mj), int(mn)) > a.max_ptx:
            die(f"the fatbin's PTX is ISA {int(mj)}.{int(mn)}, above {a.max_ptx[0]}.{a.max_ptx[1]}")
    for t in PTX_TARGET.findall(blob):
        if int(t) > a.max_sm:
            die(f"the fatbin's PTX targets sm_{int(t)}, above sm_{a.max_sm}")
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, a.out)
    vs = sorted({f"{int(x)}.{int(y)}" for x, y in found})
    print(f"cuda_fatbin: {a.out}: {len(blob)} bytes; SASS sm_{',sm_'.join(map(str, a.sass))}; "
          f"PTX compute_{',compute_'.join(map(str, a.ptx))} (ISA {', '.join(vs)}); "
          f"NVRTC/nvFatbin {a.cuda[0]}.{a.cuda[1]}", file=sys.stderr)


if __name__ == "__main__":
    main()
