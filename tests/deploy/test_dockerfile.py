"""deploy/Dockerfile, checked without Docker: paths, user, healthcheck, entrypoint, build context."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from tests.deploy import dockerfile as df
from tests.deploy.k8s import DEPLOY, DOCKERFILE, ROOT

IGNORE_FILE = DEPLOY / "Dockerfile.dockerignore"


@pytest.fixture(scope="module")
def parsed() -> list[df.Stage]:
    return df.parse(DOCKERFILE)


@pytest.fixture(scope="module")
def final(parsed: list[df.Stage]) -> df.Stage:
    return parsed[-1]


def _local_copies(stages: list[df.Stage]) -> list[tuple[df.Instruction, str, str]]:
    """(instruction, source, destination) of every COPY/ADD that reads the build context."""
    out = []
    for st in stages:
        for ins in st.all("COPY") + st.all("ADD"):
            flags, sources, dest = df.copy_sources(ins)
            if "from" in flags:
                continue
            out += [(ins, s, dest) for s in sources]
    return out


def _context_files(rel: str) -> list[str]:
    """Files of the repo under ``rel`` (a file or a directory), POSIX and relative to the repo root."""
    p = ROOT / rel
    if p.is_file():
        return [rel.strip("/")]
    return sorted(
        f.relative_to(ROOT).as_posix()
        for f in p.rglob("*")
        # Local build output (git-ignored; the ignore file keeps it out of the context): bytecode, and the
        # compiled wire loop that an editable install leaves beside its source.
        if f.is_file() and "__pycache__" not in f.parts and not f.name.endswith((".pyc", ".so"))
    )


def test_base_images_are_python_311_slim_and_the_build_is_multi_stage(parsed):
    stages = parsed
    assert len(stages) >= 2, "a build stage and a runtime stage"
    for st in stages:
        assert st.base == "python:3.11-slim", f"stage {st.name or '(final)'} is based on {st.base}"
    build = stages[0]
    assert build.name, "the build stage needs a name for --from"
    assert any("pip wheel" in r.args and ".[sidecar]" in r.args for r in build.all("RUN")), (
        "the build stage must build wheels of this repo with the sidecar extra"
    )
    installs = [r for r in stages[-1].all("RUN") if "pip install" in r.args]
    assert installs and any('"inferwatch[sidecar]"' in r.args and "--no-index" in r.args for r in installs), (
        "the runtime stage must install inferwatch[sidecar] from the built wheels only"
    )
    assert any(f"from={build.name}" in r.args for r in installs), "the wheels come from the build stage"


def test_every_copied_path_exists_in_the_repository(parsed):
    copies = _local_copies(parsed)
    assert copies, "the Dockerfile copies nothing from the build context"
    for ins, src, _dest in copies:
        assert not PurePosixPath(src).is_absolute() and ".." not in PurePosixPath(src).parts, src
        assert (ROOT / src).exists(), f"Dockerfile line {ins.line}: COPY source {src!r} is not in the repository"


def test_the_context_holds_exactly_the_copied_files(parsed):
    context = df.context_files(ROOT, df.read_dockerignore(IGNORE_FILE), DOCKERFILE.relative_to(ROOT).as_posix())
    copied: set[str] = set()
    for ins, src, _dest in _local_copies(parsed):
        files = _context_files(src)
        assert files, f"line {ins.line}: {src} holds no files"
        dropped = [f for f in files if f not in context]
        assert not dropped, f"line {ins.line}: the build context leaves out {dropped[:5]} ({IGNORE_FILE.name})"
        copied.update(files)
    # The client always sends the Dockerfile itself; nothing else that the build does not read.
    extra = context - copied - {DOCKERFILE.relative_to(ROOT).as_posix()}
    assert not extra, f"sent to the Docker daemon but never copied: {sorted(extra)[:10]}"


def test_dockerignore_keeps_the_context_small():
    patterns = df.read_dockerignore(IGNORE_FILE)
    for rel in (".git/HEAD", ".venv/bin/python", "tests/conftest.py", "bench/x.py",
                "sdk/inferwatch/__pycache__/_core.cpython-311.pyc", "inferwatch.egg-info/PKG-INFO"):
        assert df.is_ignored(rel, patterns), f"{rel} would be sent to the Docker daemon"
    # The matcher itself: a re-included file inside an excluded directory, and a later exclusion.
    assert not df.is_ignored("deploy/docker/sidecar.yaml", patterns)
    assert df.is_ignored("deploy/k8s/deployment.yaml", patterns)


def test_the_build_gets_everything_the_package_build_reads(parsed):
    """pyproject's readme and every package root must be in the build stage."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    needed = {"pyproject.toml", meta["project"]["readme"], *meta["tool"]["setuptools"]["packages"]["find"]["where"]}
    copied = {src.strip("/") for ins, src, _ in _local_copies(parsed[:1])}
    assert needed <= copied, f"the build stage does not copy {sorted(needed - copied)}"


def test_runs_as_a_numeric_non_root_user(final):
    user = final.last("USER")
    assert user is not None, "the runtime stage must set USER"
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user.args!r}: use a numeric non-root UID (runAsNonRoot checks it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # USER must come after the last RUN that needs root (pip install, useradd).
    assert all(r.line < user.line for r in final.all("RUN")), "RUN after USER would run as the unprivileged user"
    created = [r for r in final.all("RUN") if "useradd" in r.args]
    assert created and f"--uid {uid}" in created[0].args, "the UID in USER must be the one useradd creates"


def test_healthcheck_asks_healthz_with_python_urllib(final):
    hc = final.last("HEALTHCHECK")
    assert hc is not None, "HEALTHCHECK is missing"
    flags, rest = hc.flags_and_rest()
    assert rest.startswith("CMD "), "HEALTHCHECK CMD [...]"
    cmd = df.Instruction("CMD", rest[4:], hc.line).exec_form()
    assert cmd is not None and cmd[:2] == ["python", "-c"], "exec form: slim has no shell tools worth relying on"
    assert "urllib" in cmd[2] and "/healthz" in cmd[2] and "INFERWATCH_HTTP__PORT" in cmd[2]
    compile(cmd[2], "<HEALTHCHECK>", "exec")
    for key in ("interval", "timeout", "start-period", "retries"):
        assert key in flags, f"HEALTHCHECK --{key} is not set"


def test_exposes_the_http_port_and_declares_the_socket_volume(final):
    from inferwatch_sidecar.config import load_config

    config_copy = [(src, dest) for ins, src, dest in _local_copies([final]) if dest.endswith(".yaml")]
    assert len(config_copy) == 1, "the image bakes in one default config file"
    src, dest = config_copy[0]
    cfg = load_config(ROOT / src, environ={})
    assert cfg.http.host == "0.0.0.0", "inside a container loopback cannot be scraped"
    exposed = {int(p.split("/")[0]) for ins in final.all("EXPOSE") for p in ins.args.split()}
    assert cfg.http.port in exposed
    volumes = {v for ins in final.all("VOLUME") for v in (ins.exec_form() or ins.args.split())}
    assert cfg.ingest.socket is not None
    assert str(PurePosixPath(cfg.ingest.socket).parent) in volumes, "the socket's directory must be a VOLUME"
    # ENTRYPOINT + CMD must load exactly this file.
    cmd = final.last("CMD")
    assert cmd is not None and cmd.exec_form() == ["--config", dest]


def test_entrypoint_and_cmd_parse_with_the_real_cli(final):
    from inferwatch_sidecar.cli import build_parser
    from inferwatch_sidecar.cli import sidecar as daemon_cli

    entry = final.last("ENTRYPOINT")
    cmd = final.last("CMD")
    assert entry is not None and cmd is not None
    argv = entry.exec_form()
    assert argv is not None, "ENTRYPOINT must use the exec form so SIGTERM reaches the sidecar"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert argv[0] in scripts, f"{argv[0]!r} is not a console script of the package"
    args = build_parser().parse_args(argv[1:] + (cmd.exec_form() or []))
    assert args.command == "sidecar" and args.func is daemon_cli.run


def test_the_entrypoint_parser_rejects_an_unknown_flag():
    """The check above can fail: argparse exits on a flag the sidecar does not have."""
    from inferwatch_sidecar.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["sidecar", "--no-such-flag"])
