"""The three compiled parts of the sidecar (issue 23, item 8): its loop over a wire frame's records, the
reading of a batch's feature rows into a matrix, and the canary's pass over a staged batch.

Everything else is in pyproject.toml. Both extensions are optional: without a C compiler the build goes on
and the sidecar runs the pure-Python paths they replace (``/v1/status`` says which wire loop runs). CI
(``CI=true``) requires them: ``tests/ingest/test_wirec.py``, ``tests/stats/test_rows.py`` and
``tests/components/canary/test_gatherc.py`` fail when one is missing.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "inferwatch_sidecar.ingest._wirec",
            sources=["sidecar/inferwatch_sidecar/ingest/_wirec.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "inferwatch_sidecar.stats._rows",
            sources=["sidecar/inferwatch_sidecar/stats/_rows.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "inferwatch_sidecar.components.canary._gatherc",
            sources=["sidecar/inferwatch_sidecar/components/canary/_gatherc.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
    ]
)
