#!/usr/bin/env python3
"""Writes the values table of the chart's README from values.yaml.

Every key of values.yaml with a comment above it is a row: its path, its
default (as values.yaml sets it, in YAML flow style) and the comment. A key
whose children carry comments of their own gets no row; its children do.
The table goes between the README's `<!-- values:begin -->` and
`<!-- values:end -->` lines; the rest of the README is left as written.

    scripts/chart-readme.py          # rewrite the table
    scripts/chart-readme.py --check  # exit 1 if the README's table is stale
"""

import pathlib
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit("chart-readme.py needs PyYAML: apt-get install python3-yaml, or pip install pyyaml")

CHART = pathlib.Path(__file__).resolve().parent.parent / "deploy/helm/cloud-route-controller"
BEGIN, END = "<!-- values:begin -->", "<!-- values:end -->"
KEY = re.compile(r"^( *)([A-Za-z][A-Za-z0-9_]*):(.*)$")


def comments_by_path(text):
    """{path: comment} for every key line, from the comment lines just above it."""
    found, stack, pending = {}, [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        if not stripped:
            pending = []
            continue
        m = KEY.match(line)
        if not m or stripped.startswith("- "):
            pending = []
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        path = ".".join(k for _, k in stack)
        found[path] = " ".join(pending)
        pending = []
    return found


def flow(value):
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    if text.endswith("\n...") or text.endswith(" ..."):
        text = text[: -len("...")].strip()
    text = text.removesuffix("...").strip()
    return '""' if text == "''" else text


def rows(values, comments, prefix=""):
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        children = isinstance(value, dict) and any(
            comments.get(f"{path}.{k}") for k in value
        )
        if children:
            out.extend(rows(value, comments, f"{path}."))
            continue
        if isinstance(value, str) and "\n" in value:
            default = "(text, see values.yaml)"
        else:
            default = flow(value)
        cell = comments.get(path, "")
        out.append((path, default, cell))
    return out


def table():
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    lines = ["| key | default | description |", "|---|---|---|"]
    for path, default, cell in rows(values, comments_by_path(text)):
        default = default.replace("|", "\\|")
        cell = cell.replace("|", "\\|")
        lines.append(f"| `{path}` | `{default}` | {cell} |")
    return "\n".join(lines)


def main():
    readme = CHART / "README.md"
    current = readme.read_text()
    if BEGIN not in current or END not in current:
        sys.exit(f"{readme}: no {BEGIN} ... {END} section")
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    wanted = f"{head}{BEGIN}\n{table()}\n{END}{tail}"
    if "--check" in sys.argv[1:]:
        if wanted != current:
            sys.exit(f"{readme}'s values table is stale: run scripts/chart-readme.py")
        return
    readme.write_text(wanted)


if __name__ == "__main__":
    main()
