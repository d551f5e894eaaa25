"""Build the native core: C sources + the Cython communicator, -O3."""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCES = sorted(
    os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "native", "*.c"))
    if os.path.basename(p) != "_core.c"  # Cython's output for _core.pyx
)

# -O3 so the reduction loops vectorize; the kernels add AVX2 clones themselves
# (target_clones), so no -march here: the wheel must run on any x86-64.
CFLAGS = ["-O3", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wno-unused-function",
          "-Wno-unknown-pragmas"]

ext = Extension(
    "collectives._core",
    sources=["native/_core.pyx"] + C_SOURCES,
    include_dirs=["native", numpy.get_include()],
    extra_compile_args=CFLAGS,
    libraries=["pthread"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(
    ext_modules=cythonize(
        [ext],
        include_path=["native"],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False,
                             "embedsignature": True},
    ),
)
