"""Defect detectors of the fake "careful" reviewer: pure functions over prompt text.

The prompt format is a contract with `shared/prompts.py` (FILE_OPEN, FILE_CLOSE, render_file,
RESPONSE_OPEN, RESPONSE_CLOSE, STAGE_MARKER). It is duplicated here as regular expressions on
purpose: the fake provider starts inside `llm-council gate --offline`, whose whole run has a
tight time budget, and `shared/prompts.py` imports pydantic. Stdlib only (json, re).

Each detector looks at one source line at a time and reports `path:line` with the line number
of the file (as rendered in the prompt), never the position in the prompt.
"""

from __future__ import annotations

import json
import re

# --- the prompt contract (see shared/prompts.py) -------------------------------------------
#: FILE_OPEN = '<<<FILE path="{path}" lines={lines}>>>'
FILE_OPEN_RE = re.compile(r'^<<<FILE path="(?P<path>.*)" lines=(?P<lines>\d+)>>>$')
#: FILE_CLOSE = "<<<END FILE>>>"
FILE_CLOSE = "<<<END FILE>>>"
#: render_file: f"{i:>{width}} | {line}" (right-aligned line number, " | ", the source line)
BODY_LINE_RE = re.compile(r"^\s*(?P<no>\d+) \|(?: (?P<text>.*))?$")
#: RESPONSE_OPEN = "<<<UNTRUSTED RESPONSE {label}>>>"
RESPONSE_OPEN_RE = re.compile(r"^<<<UNTRUSTED RESPONSE (?P<label>[A-Za-z0-9_]+)>>>$")
#: RESPONSE_CLOSE = "<<<END UNTRUSTED RESPONSE {label}>>>"
RESPONSE_CLOSE_FMT = "<<<END UNTRUSTED RESPONSE {label}>>>"
#: STAGE_MARKER = "COUNCIL STAGE: {stage}"
STAGE_RE = re.compile(r"^COUNCIL STAGE: (?P<stage>[A-Za-z0-9_-]+)\s*$", re.MULTILINE)

SEVERITY_CRITICAL = "critical"
SEVERITY_MAJOR = "major"

Finding = dict[str, str]
SourceLine = tuple[int, str]


class SourceFile:
    """One `<<<FILE>>>` block of the subject: its path and (line number, text) pairs."""

    __slots__ = ("declared_lines", "lines", "path")

    def __init__(self, path: str, declared_lines: int, lines: list[SourceLine]) -> None:
        self.path = path
        self.declared_lines = declared_lines
        self.lines = lines

    def __repr__(self) -> str:
        return f"SourceFile({self.path!r}, {len(self.lines)} lines)"


# --- parsing -------------------------------------------------------------------------------


def parse_stage(prompt: str) -> str | None:
    """The stage named by the first `COUNCIL STAGE: <stage>` line, or None."""
    m = STAGE_RE.search(prompt)
    return m.group("stage") if m else None


def parse_files(prompt: str) -> list[SourceFile]:
    """Every `<<<FILE>>>` block of the prompt, skipping text inside untrusted responses."""
    files: list[SourceFile] = []
    current: SourceFile | None = None
    response_close: str | None = None
    for raw in prompt.splitlines():
        if response_close is not None:
            if raw == response_close:
                response_close = None
            continue
        if current is not None:
            if raw == FILE_CLOSE:
                files.append(current)
                current = None
                continue
            m = BODY_LINE_RE.match(raw)
            if m:
                current.lines.append((int(m.group("no")), m.group("text") or ""))
            continue
        m = FILE_OPEN_RE.match(raw)
        if m:
            current = SourceFile(m.group("path"), int(m.group("lines")), [])
            continue
        m = RESPONSE_OPEN_RE.match(raw)
        if m:
            response_close = RESPONSE_CLOSE_FMT.format(label=m.group("label"))
    if current is not None:  # an unterminated block still counts as reviewed text
        files.append(current)
    return files


def parse_responses(prompt: str) -> list[tuple[str, str]]:
    """The fenced peer responses as (label, body) pairs, in the order they appear."""
    out: list[tuple[str, str]] = []
    label: str | None = None
    close = ""
    body: list[str] = []
    for raw in prompt.splitlines():
        if label is not None:
            if raw == close:
                out.append((label, "\n".join(body)))
                label = None
                body = []
            else:
                body.append(raw)
            continue
        m = RESPONSE_OPEN_RE.match(raw)
        if m:
            label = m.group("label")
            close = RESPONSE_CLOSE_FMT.format(label=label)
    return out


def load_json_object(text: str) -> dict[str, object] | None:
    """Parse a JSON object, also from a ```json fence or surrounding prose; None if none."""
    candidates = [text.strip()]
    fence = re.search(r"```(?:json)?\s*\n(.*?)\n\s*```", text, re.DOTALL)
    if fence:
        candidates.append(fence.group(1))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for cand in candidates:
        try:
            value = json.loads(cand)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def finding_locations(answer: dict[str, object] | None) -> set[str]:
    """The normalised locations of the findings of a parsed answer."""
    if not answer:
        return set()
    findings = answer.get("findings")
    if not isinstance(findings, list):
        return set()
    locs: set[str] = set()
    for f in findings:
        if isinstance(f, dict):
            loc = f.get("location")
            if isinstance(loc, str) and loc.strip():
                locs.add(loc.strip())
    return locs


# --- lexical helpers -----------------------------------------------------------------------

_STRING_RE = re.compile(
    r"(?P<prefix>\b[rRbBuUfF]{1,2})?(?P<q>\"\"\"|'''|\"|'|`)(?P<body>(?:\\.|(?!(?P=q)).)*)(?P=q)"
)


class _Literal:
    __slots__ = ("body", "end", "prefix", "quote", "start")

    def __init__(self, start: int, end: int, prefix: str, quote: str, body: str) -> None:
        self.start = start
        self.end = end
        self.prefix = prefix.lower()
        self.quote = quote
        self.body = body

    @property
    def interpolated(self) -> bool:
        if self.quote == "`":
            return "${" in self.body
        return "f" in self.prefix and "{" in self.body.replace("{{", "")


def _literals(line: str) -> list[_Literal]:
    return [
        _Literal(m.start(), m.end(), m.group("prefix") or "", m.group("q"), m.group("body"))
        for m in _STRING_RE.finditer(line)
    ]


def _masked(line: str, lits: list[_Literal]) -> str:
    """The line with string contents blanked (quotes kept) and a trailing # comment removed."""
    chars = list(line)
    for lit in lits:
        inner_start = lit.start + len(lit.prefix) + len(lit.quote)
        inner_end = lit.end - len(lit.quote)
        for i in range(inner_start, inner_end):
            chars[i] = "_"
    masked = "".join(chars)
    hash_at = masked.find("#")
    return masked[:hash_at] if hash_at >= 0 else masked


def _next_code(line: str, pos: int) -> str:
    return line[pos:].lstrip()


def _prev_code(line: str, pos: int) -> str:
    return line[:pos].rstrip()


# --- (a) SQL built by string formatting ----------------------------------------------------

_SQL_UPPER = re.compile(
    r"\b(?:SELECT\b[\s\S]*\bFROM|INSERT\s+INTO|UPDATE\b[\s\S]*\bSET|DELETE\s+FROM)\b"
    r"|^\s*(?:WHERE|AND|OR)\s+\w+\s*(?:=|<|>|LIKE\b|IN\b)"
)
_SQL_LEADING = re.compile(
    r"^\s*(?:select\s+(?:\*|[\w.]+(?:\s*,\s*[\w.]+)*)\s+from\s+\w"
    r"|insert\s+into\s+\w|update\s+\w+\s+set\s+\w"
    r"|delete\s+from\s+\w)",
    re.IGNORECASE,
)


def _is_sql(body: str) -> bool:
    return bool(_SQL_UPPER.search(body) or _SQL_LEADING.search(body))


def _sql_formatting(line: str, lit: _Literal) -> str | None:
    """How the SQL literal is formatted with runtime values, or None if it is not."""
    if lit.interpolated:
        return "an f-string" if lit.quote != "`" else "a template literal"
    after = _next_code(line, lit.end)
    if after.startswith("%") and not after.startswith("%="):
        return "% formatting"
    if after.startswith(".format("):
        return ".format()"
    if after.startswith("+") and after[1:].lstrip()[:1] not in ("'", '"', "`"):
        return "+ concatenation"
    before = _prev_code(line, lit.start)
    if before.endswith("+") and not before.endswith("++"):
        operand = before[:-1].rstrip()
        if not operand.endswith(("'", '"', "`")):
            return "+ concatenation"
    if before.endswith("+="):
        return "+ concatenation"
    return None


def detect_sql_formatting(line: str) -> str | None:
    lits = _literals(line)
    code_end = len(_masked(line, lits))
    for lit in lits:
        if lit.start < code_end and _is_sql(lit.body):
            how = _sql_formatting(line, lit)
            if how:
                return (
                    f"SQL query built by string formatting ({how}): SQL injection; "
                    "pass the values as query parameters"
                )
    return None


# --- (b) eval / exec on non-literals -------------------------------------------------------

_EVAL_RE = re.compile(r"(?<![\w.])(?P<fn>eval|exec)\s*\(")
_LITERAL_ARG = re.compile(
    r"""^(?:[rRbBuU]{0,2}(?:"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')|[-+]?\d[\d_.eE+-]*)$"""
)


def _call_argument(masked: str, original: str, open_paren: int) -> str | None:
    depth = 0
    for i in range(open_paren, len(masked)):
        c = masked[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return original[open_paren + 1 : i].strip()
    return original[open_paren + 1 :].strip()  # continues on the next line: not a literal


def detect_eval(line: str) -> str | None:
    lits = _literals(line)
    masked = _masked(line, lits)
    for m in _EVAL_RE.finditer(masked):
        if re.search(r"\bdef\s+$", masked[: m.start()]):
            continue
        arg = _call_argument(masked, line, m.end() - 1)
        if not arg:
            continue
        if _LITERAL_ARG.match(arg):
            continue
        fn = m.group("fn")
        return f"{fn}() called on a non-literal value: arbitrary code execution"
    return None


# --- (c) hard-coded credentials ------------------------------------------------------------

_CRED_NAME = r"\w*(?:password|passwd|pwd|api_?key|apikey|secret|token|access_key)\w*"
_CRED_ASSIGN = re.compile(
    r"""(?ix)
    (?:^|[\s,({\[])                                  # start of the name
    ["']?(?P<name>"""
    + _CRED_NAME
    + r""")["']?     # name, maybe a quoted dict key
    (?:\s*:\s*[\w\[\]., |]+?)?                      # optional type annotation
    \s*(?::|=(?!=))\s*                              # assignment, keyword or dict entry
    [rRbBuU]?(?P<q>["'])(?P<value>(?:\\.|(?!(?P=q)).)*)(?P=q)
    """
)
_CRED_NAME_EXCLUDED = re.compile(
    r"(?i)(?:_|^)(?:prompt|label|field|hint|message|msg|header|name|url|uri|path|file|env|var"
    r"|type|kind|length|len|pattern|regex|endpoint|placeholder|format|fmt|key_name|id)$"
)
_AWS_KEY = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")


def detect_credentials(line: str) -> str | None:
    if _AWS_KEY.search(line):
        return "hard-coded AWS access key id: move it to a secret store and rotate it"
    code_end = len(_masked(line, _literals(line)))
    for m in _CRED_ASSIGN.finditer(line):
        name, value = m.group("name"), m.group("value")
        if m.start("name") >= code_end:
            break  # in a comment
        if not value.strip() or _CRED_NAME_EXCLUDED.search(name):
            continue
        if _next_code(line, m.end()).startswith(("+", "%", ".", "[")):
            continue  # a literal combined with runtime values, not a secret on its own
        if re.fullmatch(r"\$\{[^}]*\}|\{\{[^}]*\}\}|<[^>]*>|%\([^)]*\)s|\*+|x+", value):
            continue  # a template placeholder or a mask, not a secret
        return f"hard-coded credential in '{name}': read it from the environment or a secret store"
    return None


# --- (d) bare except that swallows errors --------------------------------------------------

_BARE_EXCEPT = re.compile(r"^\s*except\s*:\s*(?P<rest>.*)$")
_PASS = re.compile(r"^\s*pass\s*(?:#.*)?$")


def detect_bare_except(line: str, next_line: str | None) -> str | None:
    m = _BARE_EXCEPT.match(line)
    if not m:
        return None
    rest = m.group("rest")
    same_line = bool(_PASS.match(rest))
    rest_empty = not rest.split("#", 1)[0].strip()
    next_is_pass = next_line is not None and bool(_PASS.match(next_line))
    if same_line or (rest_empty and next_is_pass):
        return "bare 'except:' with 'pass' silently swallows every error, including bugs"
    return None


# --- the reviewer --------------------------------------------------------------------------


def _finding(severity: str, description: str, path: str, line_no: int) -> Finding:
    return {
        "severity": severity,
        "description": description,
        "location": f"{path}:{line_no}",
        "dimension": "accuracy",
    }


def detect_file(f: SourceFile) -> list[Finding]:
    """All findings in one file, in line order."""
    out: list[Finding] = []
    lines = f.lines
    for idx, (no, text) in enumerate(lines):
        nxt = lines[idx + 1][1] if idx + 1 < len(lines) else None
        for desc in (detect_sql_formatting(text), detect_eval(text), detect_credentials(text)):
            if desc:
                out.append(_finding(SEVERITY_CRITICAL, desc, f.path, no))
        desc = detect_bare_except(text, nxt)
        if desc:
            out.append(_finding(SEVERITY_MAJOR, desc, f.path, no))
    return out


def detect(prompt_or_files: str | list[SourceFile]) -> list[Finding]:
    """All findings in the subject of a prompt (or in already parsed files)."""
    files = parse_files(prompt_or_files) if isinstance(prompt_or_files, str) else prompt_or_files
    out: list[Finding] = []
    for f in files:
        out.extend(detect_file(f))
    return out
