"""Build the native core: C sources + the Cython communicator, -O3."""
import glob
import os

import numpy
import shutil

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

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

# Sources compiled at run time by an adapter (the JAX FFI handler, built on
# first use against the installed jaxlib) ship inside the package.
RUNTIME_SOURCES = ["native/jax_ffi.cc", "native/coll.h"]


class BuildPy(build_py):
    """build_py that also copies the run-time compiled sources into collectives/_native."""

    def run(self):
        dest = os.path.join(self.build_lib, "collectives", "_native")
        os.makedirs(dest, exist_ok=True)
        for src in RUNTIME_SOURCES:
            shutil.copy(os.path.join(HERE, src), dest)
        super().run()


setup(
    cmdclass={"build_py": BuildPy},
    ext_modules=cythonize(
        [ext],
        include_path=["native"],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False,
                             "embedsignature": True},
    ),
)
