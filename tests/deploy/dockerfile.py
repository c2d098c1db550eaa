"""A small Dockerfile and .dockerignore reader for the deploy tests (Docker is not available here).

It understands what deploy/Dockerfile uses: line continuations, comments and
parser directives, ``ARG`` before ``FROM`` (substituted into ``FROM``), stages
(``FROM image AS name``), flags (``--from=``, ``--mount=``, ``--interval=``),
and the shell and JSON (exec) forms of arguments.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # the raw argument text, continuation lines joined
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
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages of a Dockerfile."""
    logical: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.rstrip()
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue  # blank line, comment or parser directive
        if buf and stripped.startswith("#"):
            continue  # Docker drops comment lines inside a continued instruction
        if not buf:
            start = n
        if line.endswith("\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        logical.append((start, " ".join(s.strip() for s in buf)))
        buf = []
    assert not buf, f"{path}: the last instruction ends with a line continuation"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for n, text in logical:
        keyword, _, args = text.partition(" ")
        ins = Instruction(keyword.upper(), args.strip(), n)
        if ins.keyword == "FROM":
            words = _substitute(ins.args, global_args).split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            assert len(words) in (1, 3), f"{path}:{n}: cannot read FROM {ins.args!r}"
            stages.append(Stage(words[0], name))
        elif not stages:
            assert ins.keyword == "ARG", f"{path}:{n}: only ARG may come before the first FROM"
            key, _, value = ins.args.partition("=")
            global_args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


def _substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def copy_sources(ins: Instruction) -> tuple[dict[str, str], list[str], str]:
    """(flags, sources, destination) of a COPY or ADD."""
    flags, rest = ins.flags_and_rest()
    words = ins.exec_form() if rest.startswith("[") else shlex.split(rest)
    assert words is not None and len(words) >= 2, f"line {ins.line}: COPY needs a source and a destination"
    return flags, words[:-1], words[-1]


# ---------------------------------------------------------------------------
# .dockerignore, with the semantics of moby's patternmatcher (used by BuildKit)


@dataclass
class _Pattern:
    regex: re.Pattern[str]
    exclusion: bool
    text: str


def _compile(pattern: str) -> re.Pattern[str]:
    out = ["^"]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):  # "**/" also matches nothing at all
                    out.append("(.*/)?")
                    i += 1
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(ch))
        i += 1
    out.append("$")
    return re.compile("".join(out))


def read_dockerignore(path: Path) -> list[_Pattern]:
    patterns = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        exclusion = text.startswith("!")
        if exclusion:
            text = text[1:].strip()
        text = text.strip("/")  # patterns are relative to the context root; "dir/" means dir
        text = re.sub(r"/+", "/", text)
        patterns.append(_Pattern(_compile(text), exclusion, raw.strip()))
    return patterns


def is_ignored(rel_path: str, patterns: list[_Pattern]) -> bool:
    """Whether the build context leaves out ``rel_path`` (POSIX, relative to the context root).

    The last pattern that matches the path or one of its parent directories decides, as in
    moby's ``MatchesOrParentMatches``.
    """
    parts = rel_path.split("/")
    parents = ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]
    ignored = False
    for p in patterns:
        if p.exclusion != ignored:
            continue
        if p.regex.match(rel_path) or any(p.regex.match(d) for d in parents):
            ignored = not p.exclusion
    return ignored
