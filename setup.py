"""The package's one compiled part, `quorumlog.proto._speedups` (quorumlog/proto/speedups.py says why).

Optional: where it cannot be built (no C compiler or no Python headers) the install goes on without it and
the Python code runs. Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "quorumlog.proto._speedups",
            ["quorumlog/proto/_speedups.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
