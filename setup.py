"""Build the native core: C sources + the Cython communicator, -O3, and the
CUDA parts (native/cuda/*.cu) when nvcc is found or COLLECTIVES_CUDA=1."""
import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# native/ is in layers, one folder each (README "Layout"); every C file of
# every layer goes into the one extension.
C_SOURCES = sorted(
    os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "native", "**", "*.c"),
                                                recursive=True)
    if os.path.basename(p) != "_core.c"  # Cython's output for _core.pyx
)

# -O3 so the reduction loops vectorize; the kernels add AVX2 clones themselves
# (target_clones), so no -march here: the wheel must run on any x86-64.
CFLAGS = ["-O3", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wno-unused-function",
          "-Wno-unknown-pragmas"]

CUDA_SOURCES = sorted(os.path.relpath(p, HERE) for p in
                      glob.glob(os.path.join(HERE, "native", "**", "*.cu"), recursive=True))
# SASS for Ampere and Hopper, and Hopper PTX that the driver compiles for
# anything newer (CUDA 13 no longer targets sm_70).
CUDA_ARCHS = ("80", "90")
CUDA_PTX = "90"


def find_cuda():
    """The CUDA toolkit root to build with, or None (COLLECTIVES_CUDA: 1, 0 or auto)."""
    mode = os.environ.get("COLLECTIVES_CUDA", "auto").strip().lower()
    if mode in ("0", "no", "off", "false"):
        print("collectives: COLLECTIVES_CUDA=0, building without CUDA", file=sys.stderr)
        return None
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    for root in filter(None, candidates):
        if os.path.exists(os.path.join(root, "bin", "nvcc")) and \
                os.path.exists(os.path.join(root, "include", "cuda_runtime_api.h")):
            return root
    if mode in ("1", "yes", "on", "true"):
        raise SystemExit("collectives: COLLECTIVES_CUDA=1 but no CUDA toolkit (nvcc) was found; "
                         "set CUDA_HOME or put nvcc on PATH")
    print("collectives: nvcc not found, building without CUDA (GPU buffers will be rejected; "
          "set COLLECTIVES_CUDA=1 to require it)", file=sys.stderr)
    return None


def cuda_lib_dir(root):
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"),
                os.path.join("targets", "sbsa-linux", "lib")):
        if os.path.exists(os.path.join(root, sub, "libcudart_static.a")):
            return os.path.join(root, sub)
    raise SystemExit(f"collectives: no libcudart_static.a under {root}")


def gencode_flags(nvcc):
    """-gencode flags for the architectures this nvcc supports among ours."""
    try:
        known = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True,
                               check=True).stdout
        have = set(re.findall(r"compute_(\d+)", known))
    except (OSError, subprocess.CalledProcessError):
        have = set(CUDA_ARCHS)
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS if a in have]
    if CUDA_PTX in have:
        flags.append(f"-gencode=arch=compute_{CUDA_PTX},code=compute_{CUDA_PTX}")
    if not flags:
        raise SystemExit(f"collectives: {nvcc} supports none of sm_{', sm_'.join(CUDA_ARCHS)}")
    return flags


def parallel_compile(compiler, jobs):
    """Make `compiler` compile an extension's sources `jobs` at a time, the largest first
    (setuptools compiles one extension's sources one after another; ours is one extension
    of 48 files, the Cython output alone a third of the time). Leaves a compiler without
    distutils' usual private steps as it is."""
    if jobs < 2 or not all(hasattr(compiler, n) for n in ("_setup_compile", "_get_cc_args",
                                                          "_compile")):
        return

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        todo = sorted((o for o in objects if o in build),
                      key=lambda o: -os.path.getsize(build[o][0]))
        with ThreadPoolExecutor(jobs) as pool:
            for _ in pool.map(one, todo):  # re-raises the first compiler error
                pass
        return objects

    compiler.compile = compile


class BuildExt(build_ext):
    """build_ext that first compiles native/**/*.cu with nvcc into the extension, and
    compiles the C sources in parallel (one job per CPU, or build_ext -j N)."""

    def build_extensions(self):
        parallel_compile(self.compiler, int(self.parallel or 0) if self.parallel not in
                         (None, True) else (os.cpu_count() or 1))
        root = find_cuda()
        if root:
            nvcc = os.path.join(root, "bin", "nvcc")
            flags = gencode_flags(nvcc)
            for ext in self.extensions:
                objects = []
                for src in CUDA_SOURCES:
                    obj = os.path.join(self.build_temp, os.path.splitext(src)[0] + ".o")
                    os.makedirs(os.path.dirname(obj), exist_ok=True)
                    cmd = [nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden",
                           "-Inative", *flags, "-c", src, "-o", obj]
                    print("collectives: " + " ".join(cmd), file=sys.stderr)
                    subprocess.run(cmd, check=True, cwd=HERE)
                    objects.append(obj)
                ext.extra_objects = list(ext.extra_objects or []) + objects
                ext.define_macros = list(ext.define_macros) + [("COLL_HAVE_CUDA", "1")]
                ext.include_dirs = list(ext.include_dirs) + [os.path.join(root, "include")]
                ext.library_dirs = list(ext.library_dirs or []) + [cuda_lib_dir(root)]
                # The static runtime: the module imports on machines without
                # libcudart, and without a driver reports no device.
                ext.libraries = list(ext.libraries) + ["cudart_static", "dl", "rt", "stdc++"]
        super().build_extensions()


ext = Extension(
    "collectives._core",
    sources=["native/comm/_core.pyx"] + C_SOURCES,
    include_dirs=["native", numpy.get_include()],
    extra_compile_args=CFLAGS,
    libraries=["pthread"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

# Sources compiled at run time by an adapter (the JAX FFI handler, built on
# first use against the installed jaxlib) ship inside the package.
# Paths relative to native/, kept under collectives/_native/.
RUNTIME_SOURCES = ["jax/ffi.cc", "coll.h"]



class BuildPy(build_py):
    """build_py that also copies the run-time compiled sources into collectives/_native."""

    def run(self):
        dest = os.path.join(self.build_lib, "collectives", "_native")
        os.makedirs(dest, exist_ok=True)
        for src in RUNTIME_SOURCES:
            os.makedirs(os.path.join(dest, os.path.dirname(src)), exist_ok=True)
            shutil.copy(os.path.join(HERE, "native", src), os.path.join(dest, src))
        super().run()


setup(
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
    ext_modules=cythonize(
        [ext],
        include_path=["native", "native/comm"],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False,
                             "embedsignature": True},
    ),
)
