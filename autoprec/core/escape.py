"""Untrusted text (names from a model, paths, fields of result files) into generated files and the
terminal, as data.

A model's node, tensor and file names are chosen by whoever made the model: a name may hold a
newline, quotes, ``$(...)`` or markup. Every generated script, config and card passes such text
through one of these functions, so it can never end a comment, a string or a table cell.
"""

from __future__ import annotations

import re

from autoprec.core.errors import ExportError


def printable(text: object) -> str:
    """``text`` on one line: control and other non-printable characters as Python escapes (``\\n``,
    ``\\x1b``)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shell_comment(text: str) -> str:
    """``text`` as shell comment lines: each line printable and behind ``#``, so none can become a
    command."""
    return "\n".join(f"# {printable(line)}" for line in str(text).splitlines() or [""])


_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~&\"'$])")


def markdown_text(text: object) -> str:
    """Plain text in markdown (and inside a table cell): every punctuation character a renderer
    could read as markup or HTML is backslash-escaped (CommonMark allows this for any ASCII
    punctuation)."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", printable(text))


def markdown_code(text: object) -> str:
    """``text`` as an inline code span that also holds inside a table cell (GFM reads ``\\|`` as
    ``|`` there)."""
    body = printable(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def pbtxt_string(text: str) -> str:
    """A protobuf text-format string literal (what Triton's config parser reads), C-escaped."""
    out = []
    for byte in str(text).encode("utf-8"):
        char = chr(byte)
        if char in '"\\\'':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def path_component(name: str, what: str) -> str:
    """``name`` as one folder name inside an output folder, or a one-line refusal: never ``..``, a
    separator or a control character, so nothing is written outside the folder the user chose."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or not name.isprintable():
        raise ExportError(
            f"{what} '{printable(name)}' cannot be a folder name (empty, '.', '..', a path "
            "separator or a control character); pass --name with a plain name"
        )
    return name
