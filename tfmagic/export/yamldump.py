"""YAML for Kubernetes manifests, written with PyYAML so that every reader parses it the same way.

Two things PyYAML's defaults do not give: the launcher's source stays readable
in the ConfigMap (multi-line strings are literal ``|`` blocks, not one quoted
line of ``\\n`` escapes), and strings a YAML 1.1 parser would take for
something else stay strings.  Kubernetes reads manifests with Go's YAML
library, which resolves ``y``, ``n`` and ``0o17`` to a boolean and a number
where PyYAML sees strings; so anything but a plain word is quoted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

# Written without quotes: names, paths, label keys.  Everything else is quoted
# (PyYAML picks single or double quotes), however harmless PyYAML thinks it is.
_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
# Words some YAML 1.1 parser reads as a boolean or null.
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "~"}


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, with lists indented under their key as Kubernetes' own examples are."""

    def increase_indent(self, flow: bool = False, indentless: bool = False):
        return super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        style = "|"  # PyYAML falls back to quotes where a block cannot hold the text exactly
    elif _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
        style = None
    else:
        style = "'"  # PyYAML falls back to double quotes where single ones cannot hold the text
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(document: Mapping) -> str:
    """One YAML document for the plain data manifests are made of (dicts, lists, str, int, bool, None).

    >>> print(to_yaml({"data": {"run.sh": "set -e\\necho hi\\n"}, "flag": "y"}), end="")
    data:
      run.sh: |
        set -e
        echo hi
    flag: 'y'
    """
    return yaml.dump(
        dict(document),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 16,  # never fold a long line (a TF_CONFIG) over several
    )
