"""Magics with subcommands (``%tf_cluster start ...``): one parser per verb, values checked at the door.

IPython's ``@magic_arguments`` gives one parser per magic; a magic with eleven
verbs then lists every verb's options together (``%tf_cluster?`` showed
``--tail`` and ``--image`` beside ``--hosts``).  Here each verb declares its
own arguments, so ``%tf_cluster start -h`` shows what ``start`` takes, and the
magic's docstring lists every verb with its usage line.

Value types (:func:`count`, :func:`seconds`, ...) reject what argparse's
``int``/``float`` let through (``nan``, ``-5``, Arabic-Indic digits) with a
line saying what to give instead.
"""

from __future__ import annotations

import argparse
import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser


def count(text: str) -> int:
    """A whole number >= 0 (ASCII digits)."""
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise argparse.ArgumentTypeError(f"{text} is too small; give 0 or more")
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a count such as 2")
    return int(text)


_NEGATIVE_VALUE = re.compile(r"(?<!\S)(--[A-Za-z][\w-]*)\s+(-[0-9.]\S*)")
#: options whose values are other programs' options (``--sbatch "--qos=debug"``): argparse would
#: read the value as options of its own, so they are taken out before it parses and set after
_OPTIONS_AS_VALUES = re.compile(r"(?<!\S)(--(?:sbatch|worker-sbatch))\s+(\"[^\"]*\"|'[^']*'|-\S+)")


def positive_count(text: str) -> int:
    """A whole number >= 1."""
    negative = text.startswith("-") and text[1:].isascii() and text[1:].isdigit()
    n = -1 if negative else count(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is too small; give 1 or more")
    return n


def batch_sizes(text: str) -> int | dict[str, int]:
    """``64`` for every worker, or ``worker:0=64,worker:1=16`` for each its own (the engine checks the names)."""
    if "=" not in text:
        if not (text.isascii() and text.lstrip("-").isdigit()):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a batch size; give one number (32) or each worker's (worker:0=64,worker:1=16)"
            )
        return positive_count(text)
    sizes: dict[str, int] = {}
    for part in text.split(","):
        task, eq, size = part.strip().partition("=")
        if not eq or not task.strip():
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not TASK=SIZE; write e.g. worker:0=64,worker:1=16"
            )
        sizes[task.strip()] = positive_count(size.strip())
    return sizes


def number(text: str) -> float:
    """A finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} seconds is not > 0; give a time such as 30")
    return value


def positive(text: str) -> float:
    """A finite number > 0."""
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not > 0")
    return value


def identifier(text: str) -> str:
    """A Python variable name to bind a result to."""
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a variable name; give one such as results")
    return text


def unquote(text: str) -> str:
    """``'worker:*'`` -> ``worker:*``: IPython keeps the quotes of a quoted argument."""
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def without_comment(line: str) -> str:
    """A magic's line without a trailing ``# comment``, as Python would read it.

    IPython hands a line magic everything after its name, comments included,
    so ``%tf_cluster start --ps 1   # one ps`` failed with "unrecognized
    arguments: # one ps" (the README and this package's own docstrings wrote
    it that way).  A ``#`` starts a comment at the start of the line or after
    whitespace, outside quotes; inside a word (``host#1``) it stays.

    >>> without_comment("start --ps 1   # one ps, two workers")
    'start --ps 1'
    >>> without_comment("attach 'x # y' # the quoted one stays")
    "attach 'x # y'"
    >>> without_comment("start --hosts node#1")
    'start --hosts node#1'
    """
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote and line[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


@dataclass
class Verb:
    name: str
    help: str
    func: Callable
    arguments: list[tuple[tuple, dict]] = field(default_factory=list)
    _parser: MagicArgumentParser | None = None

    def parser(self, magic: str) -> MagicArgumentParser:
        if self._parser is None:
            parser = MagicArgumentParser(
                prog=f"%{magic} {self.name}", description=self.help, formatter_class=argparse.HelpFormatter
            )
            parser.add_argument("-h", "--help", action="store_true", help="show this help")
            for args, kwargs in self.arguments:
                parser.add_argument(*args, **kwargs)
            self._parser = parser
        return self._parser


def verb(help: str):
    """Mark a method ``cmd_NAME`` as the verb NAME of its magic."""

    def mark(func):
        func._tfmagic_verb = Verb(
            func.__name__.removeprefix("cmd_"), help, func, list(reversed(getattr(func, "_tfmagic_args", [])))
        )
        return func

    return mark


def arg(*args, **kwargs):
    """An argument of a verb (applied below ``@verb``, like ``@argument`` below ``@magic_arguments``)."""

    def add(func):
        func.__dict__.setdefault("_tfmagic_args", []).append((args, kwargs))
        return func

    return add


class Verbs:
    """The verbs of one magic, found on its class; parses a line and calls the verb."""

    def __init__(self, magic: str, cls: type, default: str) -> None:
        self.magic = magic
        self.default = default
        self.verbs: dict[str, Verb] = {}
        for attr in cls.__dict__:  # in the order the class defines them
            v = getattr(cls.__dict__[attr], "_tfmagic_verb", None)
            if v is not None:
                self.verbs[v.name] = v

    def usage(self) -> str:
        """Every verb with its usage line and help, for the magic's docstring."""
        lines = [f"Verbs (``%{self.magic} VERB -h`` shows one verb's options)::", ""]
        for v in self.verbs.values():
            usage = v.parser(self.magic).format_usage().strip().removeprefix("usage: ")
            lines.append("    " + " ".join(usage.split()))
            lines.append(f"        {v.help}")
        return "\n".join(lines)

    def run(self, obj, line: str):
        words = without_comment(line).strip().split(None, 1)
        name = words[0] if words else self.default
        rest = words[1] if len(words) > 1 else ""
        if name in ("-h", "--help", "help"):
            print(self.usage())
            return None
        v = self.verbs.get(name)
        if v is None:
            raise UsageError(
                f"unknown subcommand {name!r}; use one of {', '.join(self.verbs)} (see %{self.magic}?)"
            )
        parser = v.parser(self.magic)
        # '--delay -1ms' is a value, not an option: argparse takes only plain negative numbers as values
        rest = _NEGATIVE_VALUE.sub(r"\1=\2", rest)
        taken: dict[str, str] = {}

        def take(m: re.Match) -> str:
            taken[m.group(1)[2:].replace("-", "_")] = m.group(2)
            return ""

        rest = _OPTIONS_AS_VALUES.sub(take, rest)
        args = parser.parse_argstring(rest)
        for name, value in taken.items():
            if not hasattr(args, name):
                raise UsageError(f"unrecognized arguments: --{name.replace('_', '-')}")
            setattr(args, name, value)
        if args.help:
            parser.print_help()
            return None
        return v.func(obj, args)
