"""The one compiled part: the sidecar's loop over a wire frame's records (issue 23, item 8).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the build goes on and
the sidecar decodes with the SDK's pure-Python loop (``/v1/status`` says which one runs). CI (``CI=true``)
requires it: ``tests/ingest/test_wirec.py`` fails when it is missing.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "inferwatch_sidecar.ingest._wirec",
            sources=["sidecar/inferwatch_sidecar/ingest/_wirec.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
