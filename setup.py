"""Builds only the C++ extension commsched._C; metadata lives in setup.cfg."""

import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "csrc", "*.cpp")))

# The engine is written against c10's device-generic stream/event interfaces, so one set of
# sources serves CPU and CUDA builds of torch alike; no .cu file is needed.
setup(
    ext_modules=[
        CppExtension(
            "commsched._C",
            SOURCES,
            # No -std flag: BuildExtension picks the one the installed torch needs (C++17 for
            # 2.13, C++20 for 2.14).
            extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
