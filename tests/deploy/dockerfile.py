"""deploy/Dockerfile and its ignore file, read with maintained parsers (Docker itself is not available here).

The Dockerfile is parsed by dockerfile-parse: instructions, line continuations, comments and
directives, and the ARG substitution that names each stage's base image. This module only groups
its instructions into stages and splits Docker's leading ``--flag=value`` words (``--from=``,
``--mount=``, ``--interval=``) from an instruction's arguments. The files a build context holds
are computed by the Docker SDK for Python (``docker.utils.build``), the client's implementation
of the ``.dockerignore`` rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from docker.utils.build import PatternMatcher, exclude_paths
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # the argument text, continuation lines joined
    line: int  # 1-based line of the keyword

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Leading ``--name=value`` flags (and bare ``--name``), and the text after them."""
        flags: dict[str, str] = {}
        rest = self.args.strip()
        while rest.startswith("--"):
            word, _, rest = rest.partition(" ")
            name, _, value = word[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
        return flags, rest

    def exec_form(self) -> list[str] | None:
        """The JSON array form of the arguments (after flags), or None for the shell form."""
        _, rest = self.flags_and_rest()
        if rest.startswith("["):
            value = json.loads(rest)
            assert isinstance(value, list) and all(isinstance(x, str) for x in value), self
            return value
        return None


@dataclass
class Stage:
    base: str  # the base image, build arguments substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(path: Path) -> list[Stage]:
    """The stages of a Dockerfile, in order."""
    parser = DockerfileParser(path=str(path))
    stages: list[Stage] = []
    for item in parser.structure:
        keyword = item["instruction"]
        if keyword == "COMMENT":
            continue
        ins = Instruction(keyword, item["value"], item["startline"] + 1)
        if keyword == "FROM":
            words = [w for w in WordSplitter(ins.args).split() if not w.startswith("--")]
            assert len(words) == 1 or (len(words) == 3 and words[1].lower() == "as"), (
                f"{path}:{ins.line}: cannot read FROM {ins.args!r}")
            base = parser.parent_images[len(stages)]
            stages.append(Stage(base, words[2] if len(words) == 3 else None))
        elif stages:
            stages[-1].instructions.append(ins)
    return stages


def copy_sources(ins: Instruction) -> tuple[dict[str, str], list[str], str]:
    """(flags, sources, destination) of a COPY or ADD."""
    flags, rest = ins.flags_and_rest()
    words = ins.exec_form() if rest.startswith("[") else list(WordSplitter(rest).split())
    assert words is not None and len(words) >= 2, f"line {ins.line}: COPY needs a source and a destination"
    return flags, words[:-1], words[-1]


# ---------------------------------------------------------------------------
# the build context


def read_dockerignore(path: Path) -> list[str]:
    """The patterns of an ignore file, as the Docker client reads them (comments and blank lines dropped)."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_ignored(rel_path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves out ``rel_path`` (POSIX, relative to the context root)."""
    return bool(PatternMatcher(list(patterns)).matches(rel_path))


def context_files(root: Path, patterns: list[str], dockerfile: str) -> set[str]:
    """Every file the client sends for ``docker build -f dockerfile root`` (POSIX, relative to ``root``)."""
    paths = exclude_paths(str(root), list(patterns), dockerfile=dockerfile)
    return {p for p in paths if (root / p).is_file()}
