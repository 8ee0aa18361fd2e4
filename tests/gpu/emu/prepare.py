#!/usr/bin/env python3
"""Copies kernels/cuda/ into OUT for the CPU emulation (emu.h): the inline-PTX conversions of
common.cuh and wq_common.cuh become emu_* calls, and mma_emu.cuh takes mma.cuh's place. Every
replaced line must be found, so a change to the kernels' PTX fails here loudly rather than
being emulated wrong."""
import pathlib
import shutil
import sys

here = pathlib.Path(__file__).resolve().parent
src = here.parents[2] / "kernels" / "cuda"
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)

REPLACE = {
    "common.cuh": [
        ('#pragma once\n', '#pragma once\n#include "emu.h"\n'),
        ('asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));', "f = emu_f16_to_f32(x.bits);"),
        ('asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));', "h.bits = emu_f32_to_f16(f);"),
        ('asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));', "h.bits = emu_f32_to_bf16(f);"),
    ],
    "wq_common.cuh": [
        ('asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));', "r = emu_dynamic_smem;"),
    ],
}

for f in src.iterdir():
    if f.suffix not in (".cu", ".cuh"):
        continue
    text = f.read_text()
    for old, new in REPLACE.get(f.name, []):
        if text.count(old) != 1:
            sys.exit(f"prepare.py: {f.name} no longer holds exactly one {old!r}")
        text = text.replace(old, new)
    (out / f.name).write_text(text)
shutil.copy(here / "mma_emu.cuh", out / "mma.cuh")
shutil.copy(here / "emu.h", out / "emu.h")
