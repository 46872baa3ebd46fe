"""The one place where strings that come from input are made safe for each output.

perfdoctor prints what other programs and people wrote: op, kernel and thread names from traces,
paths, rule texts from user rule files, run.json fields, py-spy frames, the script's error text.
None of it is trusted. Every renderer passes such strings through the function of its output:

- `terminal(s)`: control characters (C0 incl. ESC, DEL, C1), Unicode line/paragraph separators,
  bidi overrides and lone surrogates (undecodable bytes of a path) are shown escaped (`\\x1b`,
  `\\u202e`), so no escape sequence (OSC 52 clipboard writes, screen clears, colours,
  hyperlinks) and no reordered text reaches the terminal. `text(s)` gives a rich Text of it,
  which rich prints literally (no markup, no emoji codes); `markup(s)` escapes it for a rich
  markup string. Renderers never build markup strings from input otherwise.
- `html(s)`: escaped for element text and quoted attributes.
- `markdown(s)`: one line, with the characters that could form links, autolinks, HTML, code
  spans/fences, emphasis, headings or table cells backslash-escaped.
- `xml(s)`: characters XML 1.0 forbids shown escaped (ElementTree escapes &, <, > and quotes).
- `github_data(s)` / `github_property(s)`: the encoding GitHub documents for workflow commands
  (`%`, CR, LF; and `:` `,` in properties), so input cannot end a command or start another.

`console()` is the rich Console every renderer prints with (never cropping a file or a pipe).
"""

from __future__ import annotations

import html as _html
import re

# C0 (but not the ones a renderer keeps: see `keep`), DEL, C1, line/paragraph separators, bidi
# embeddings/overrides/isolates and marks, BOM / zero-width no-break space, lone surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff"
                     "\ud800-\udfff]")
_UNSAFE_KEEP_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                             "\u2066-\u2069\ufeff\ud800-\udfff]")
_UNSAFE_KEEP_CRLF = re.compile("[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                               "\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def terminal(s: object, keep_newlines: bool = False) -> str:
    """`s` as text, with every control character shown escaped (newlines kept with
    keep_newlines, for multi-line texts such as code snippets)."""
    s = s if isinstance(s, str) else str(s)
    return (_UNSAFE_KEEP_NL if keep_newlines else _UNSAFE).sub(_escape_char, s)


def text(s: object, style: str = "", keep_newlines: bool = False):
    """A rich Text of `s`: printed literally (rich interprets neither markup nor emoji codes in
    a Text), control characters escaped."""
    from rich.text import Text

    return Text(terminal(s, keep_newlines), style=style)


def markup(s: object) -> str:
    """`s` inside a rich markup string: control characters and tag-like `[` escaped. Emoji codes
    are left to the console: print markup with `console()` (emoji off), or use `text`."""
    from rich.markup import escape

    return escape(terminal(s))


def html(s: object) -> str:
    """Escaped for HTML element text and quoted attribute values (control characters shown)."""
    return _html.escape(terminal(s), quote=True)


NAME_CHARS = 240        # an op or kernel name in an HTML table: templated C++ names run to ~200


def html_name(s: object, limit: int = NAME_CHARS) -> str:
    """A name for an HTML table cell: escaped, and past `limit` characters cut with an ellipsis,
    the start kept in its title (a 100 KB op name had filled the page)."""
    s = s if isinstance(s, str) else str(s)
    if len(s) <= limit:
        return html(s)
    return f'<span title="{html(s[:4 * limit])}">{html(s[:limit])}…</span>'


# CommonMark: any ASCII punctuation may be backslash-escaped. These can start or form markup:
# emphasis, code, links/images, autolinks and raw HTML, headings, lists, tables, strikethrough.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~])")
_MD_AUTOLINK = re.compile(r"(?i)(www)\.|(https?|ftp|mailto):")


def markdown(s: object) -> str:
    """One line of markdown text (a table cell, a list item) that renders as `s` and forms no
    link, image, HTML, code span or fence, emphasis, heading or table cell boundary."""
    out = _MD_SPECIAL.sub(r"\\\1", terminal(s).replace("&", "&amp;"))
    # GitHub links bare URLs and www. names: break the scheme/host so they stay text.
    return _MD_AUTOLINK.sub(lambda m: f"{m.group(1)}\\." if m.group(1) else f"{m.group(2)}\\:", out)


# XML 1.0 allows #x9 #xA #xD, #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF. Everything else is
# escaped as text; the C1 range and bidi controls too (allowed, but they reach terminals).
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
                      "\ud800-\udfff\ufffe\uffff]")


def xml(s: object) -> str:
    """Text XML 1.0 can hold (ElementTree then escapes &, <, > and quotes)."""
    s = s if isinstance(s, str) else str(s)
    return _XML_BAD.sub(_escape_char, s)


def github_data(s: object) -> str:
    """The message of a workflow command (`::error title=...::MESSAGE`), encoded as GitHub's
    runner decodes it: `%` -> %25, CR -> %0D, LF -> %0A; other control characters shown escaped."""
    s = _UNSAFE_KEEP_CRLF.sub(_escape_char, s if isinstance(s, str) else str(s))
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_property(s: object) -> str:
    """A property value of a workflow command (`title=VALUE`): also `:` -> %3A, `,` -> %2C."""
    return github_data(s).replace(":", "%3A").replace(",", "%2C")


# UTF-8 of C1 controls, U+2028/2029 and bidi controls: valid in JSON strings, but a terminal
# that shows the JSON would act on them. Lead bytes never occur inside another character's
# encoding, so they are replaced as \uXXXX escapes without decoding.
_JSON_UNSAFE = re.compile(rb"\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]|\xef\xbb\xbf")


def json_bytes(encoded: bytes) -> bytes:
    """Encoded JSON with the characters terminals act on (C1, bidi, line separators) escaped.
    Each starts with one of three lead bytes: JSON without them (ASCII names) is returned as it
    is after three byte searches, not a regex scan (a 1.4 GB trace: 9 s)."""
    if b"\xc2" not in encoded and b"\xe2" not in encoded and b"\xef" not in encoded:
        return encoded
    return _JSON_UNSAFE.sub(lambda m: b"\\u%04x" % ord(m.group().decode()), encoded)


def json_safe(obj):
    """`obj` with lone surrogates in its strings (undecodable bytes of a path or a name) shown
    escaped, so it encodes as UTF-8 JSON."""
    if isinstance(obj, str):
        return _SURROGATE.sub(_escape_char, obj)
    if isinstance(obj, dict):
        return {json_safe(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


_SURROGATE = re.compile("[\ud800-\udfff]")


# The width of a console that is not a terminal: lines run long rather than being cut at 80.
UNCROPPED = 10_000


def console(stderr: bool = False, **kw):
    """The Console every renderer prints with: no highlighting of numbers/paths, no emoji codes.
    On a terminal it has the terminal's width; written to a file or a pipe (a CI log), with no
    COLUMNS set, its lines are never cropped or wrapped: each runs as long as it is (log viewers
    wrap them), where rich would cut them at 80 columns with an ellipsis."""
    import os

    from rich.console import Console

    c = Console(stderr=stderr, highlight=False, emoji=False, **kw)
    if "width" not in kw and not c.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        c.width = UNCROPPED
        if "file" not in kw:
            c.file = _Unpadded(stderr)
    return c


class _Unpadded:
    """A console's file that drops the spaces rich pads each table row with to the table's width
    (`rules list | cat` had 114 lines of 292 characters, most of them trailing blanks). The stream
    is looked up at each write, as rich does (a test's captured stdout)."""

    def __init__(self, stderr: bool):
        self.stderr, self.part = stderr, ""

    @property
    def stream(self):
        import sys
        return sys.stderr if self.stderr else sys.stdout

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        lines = (self.part + s).split("\n")
        self.part = lines.pop()
        if lines:
            self.stream.write("\n".join(x.rstrip(" ") for x in lines) + "\n")
        return len(s)

    def flush(self) -> None:
        if self.part:
            self.stream.write(self.part)
            self.part = ""
        self.stream.flush()

