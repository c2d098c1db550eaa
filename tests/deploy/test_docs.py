"""docs/deploy.md matches the code: paths, variables, commands, PromQL and YAML snippets."""

from __future__ import annotations

import re
import shlex
import subprocess

import yaml

from tests.deploy.k8s import (
    DOCS,
    MODEL_CONTAINER,
    ROOT,
    container,
    find,
    recognized_by_sidecar,
    sidecar_env_names,
)

TEXT = DOCS.read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^[ ]*```{lang}\n(.*?)^[ ]*```", TEXT, re.S | re.M)


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(x[indent:] for x in lines) + "\n"


def test_every_repository_path_the_docs_name_exists():
    paths = set(re.findall(r"`((?:deploy|docs|sdk|sidecar|alerts|dashboards)/[\w./-]*)`", TEXT))
    paths |= {f"docs/{p}" for p in re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]+)?\)", TEXT)}
    assert len(paths) > 10
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/deploy.md names paths that do not exist: {missing}"


def test_every_inferwatch_variable_the_docs_name_is_real():
    from inferwatch._env import ENV_VARS

    names = set(re.findall(r"\bINFERWATCH_[A-Z0-9_]*[A-Z0-9]\b", TEXT))
    sidecar = sidecar_env_names()
    unknown = sorted(n for n in names if n not in ENV_VARS and not recognized_by_sidecar(n, sidecar))
    assert not unknown, f"docs/deploy.md names variables nothing reads: {unknown}"


def test_the_cli_commands_in_the_docs_parse():
    from inferwatch_sidecar.cli import build_parser

    parser = build_parser()
    commands = []
    for block in _blocks("sh"):
        block = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", block, flags=re.S)  # heredoc bodies are data
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" | ")[0], comments=True)
            if words[:1] == ["inferwatch"]:
                commands.append(words[1:])
            elif words[:2] == ["docker", "run"] and "inferwatch-sidecar:0.1.0" in words:
                rest = words[words.index("inferwatch-sidecar:0.1.0") + 1:]
                if rest:
                    commands.append(["sidecar", *rest])  # arguments after the image go to ENTRYPOINT
    assert len(commands) >= 2
    for argv in commands:
        args = parser.parse_args(argv)
        assert callable(args.func), argv


def test_the_python_example_compiles():
    blocks = _blocks("python")
    assert blocks
    for b in blocks:
        compile(b, "docs/deploy.md", "exec")


def test_yaml_snippets_parse_and_the_network_policy_fits_the_pod():
    docs = [yaml.safe_load(_dedent(b)) for b in _blocks("yaml")]
    assert all(d is not None for d in docs)
    policy = next(d for d in docs if isinstance(d, dict) and d.get("kind") == "NetworkPolicy")
    pod_labels = find("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    model_ports = {p["containerPort"] for p in container(MODEL_CONTAINER)["ports"]}
    assert model_ports <= allowed and 9464 in allowed, "the policy must not cut off the API or the scrape"


def test_promql_examples_are_valid_rules(tmp_path, promtool):
    blocks = _blocks("promql")
    assert blocks
    rules = {"groups": [{"name": "docs", "rules": [
        {"record": f"docs:example_{i}", "expr": _dedent(b).strip()} for i, b in enumerate(blocks)
    ]}]}
    f = tmp_path / "docs.rules.yml"
    f.write_text(yaml.safe_dump(rules), encoding="utf-8")
    run = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr

