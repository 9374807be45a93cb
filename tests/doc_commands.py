"""The shell commands README.md and docs/*.md show, as a user would copy them.

Fenced ``bash``/``sh``/``shell``/``console`` blocks give whole commands (continuation lines joined, comments
dropped, ``a && b``, ``a; b``, ``a | b`` and ``a &`` split into their commands, leading ``NAME=value``
assignments kept apart); README's command table gives whole commands too. Inline ``dllm ...`` code in the
text gives fragments: a subcommand and some of its options, named in a sentence.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`(dllm [^`]+)`")
TABLE_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")
SEPARATORS = {"&&", "||", ";", "|", "&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    document: str  # relative to the repository root
    line: int  # where the command starts
    argv: tuple[str, ...]  # the words after the assignments, quotes removed
    env: dict[str, str] = field(default_factory=dict)  # leading NAME=value assignments
    comment: str = ""  # the comment line right below the command, if any (its expected output)
    background: bool = False  # ended by `&`

    @property
    def program(self) -> str:
        return self.argv[0] if self.argv else ""

    @property
    def label(self) -> str:
        return f"{self.document}:{self.line}: {shlex.join(self.argv)}"


def _split(words: list[str]) -> list[tuple[list[str], bool]]:
    """Words of one logical line -> its commands, each with whether it runs in the background."""
    commands, current = [], []
    for word in words:
        if word in SEPARATORS:
            if current:
                commands.append((current, word == "&"))
            current = []
        else:
            current.append(word)
    if current:
        commands.append((current, False))
    return commands


def _logical_lines(block: str, first_line: int) -> list[tuple[int, str, str]]:
    """(line number, text, the comment line that follows) with backslash continuations joined."""
    lines = block.splitlines()
    result, index = [], 0
    while index < len(lines):
        start, text = index, lines[index]
        while text.rstrip().endswith("\\") and index + 1 < len(lines):
            index += 1
            text = text.rstrip()[:-1] + " " + lines[index].strip()
        index += 1
        following = lines[index].strip() if index < len(lines) else ""
        comment = following[1:].strip() if following.startswith("#") else ""
        if text.strip() and not text.lstrip().startswith("#"):
            result.append((first_line + start, text, comment))
    return result


def _commands_of_line(document: str, number: int, text: str, comment: str) -> list[Command]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands = []
    for words, background in _split(list(lexer)):
        env = {}
        while words and ASSIGNMENT.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        commands.append(Command(document, number, tuple(words), env, comment, background))
    return commands


def fenced_commands(path: Path) -> list[Command]:
    text = path.read_text()
    document = str(path.relative_to(ROOT))
    commands = []
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL_FENCES:
            continue
        first = text[: match.start(2)].count("\n") + 1
        for number, line, comment in _logical_lines(match.group(2), first):
            commands += _commands_of_line(document, number, line, comment)
    return commands


def table_commands(path: Path) -> list[Command]:
    """The first cell of a table row, when it is a ``dllm`` or ``python -m`` command in code."""
    document = str(path.relative_to(ROOT))
    commands = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = TABLE_ROW.match(line)
        if match and re.match(r"(dllm|python -m) ", match.group(1) + " "):
            commands += _commands_of_line(document, number, match.group(1), "")
    return commands


def inline_fragments(path: Path) -> list[Command]:
    """``dllm ...`` in running text (not in a fence or a table's command cell)."""
    document = str(path.relative_to(ROOT))
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    fragments = []
    for number, line in enumerate(text.splitlines(), 1):
        if TABLE_ROW.match(line):
            line = TABLE_ROW.sub("|", line, count=1)
        for match in INLINE.finditer(line):
            fragments += _commands_of_line(document, number, match.group(1), "")
    return fragments


def all_commands() -> list[Command]:
    """Every whole command in the documents, fenced and tabled."""
    return [command for path in DOCUMENTS for command in fenced_commands(path) + table_commands(path)]


def all_fragments() -> list[Command]:
    return [fragment for path in DOCUMENTS for fragment in inline_fragments(path)]
