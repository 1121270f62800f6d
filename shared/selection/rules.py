"""Compiled-in path rules: the secret boundary, noise, and the historical extension allowlist.

These rules look at a path only, never at contents, so a denied file is decided before any
blob is read.

Secret boundary. A path is denied when ANY of its components matches a secret pattern
(gitignore semantics: a pattern without a slash matches at any depth, and a matching
directory denies everything below it, e.g. `.envs/.production/.django`). Matching is
case-insensitive (`config/.ENV.production` is denied). Two-component rules such as
`.aws/credentials` match those two consecutive components anywhere. The only exemption is a
file whose own name ends in `.example`, `.sample` or `.template` (`.env.example`,
`secrets.yaml.template`): those are documentation of a secret's shape and stay reviewable.
Nothing else can re-admit a denied path: not naming it explicitly, not an ignore file's `!`
line, not an attribute.

Noise. Lockfiles, dependency folders and minified bundles are machine output that costs
tokens and hides the real change. A repository can re-admit them through its own
`.gitattributes`: `linguist-generated=false` (or `-linguist-generated`) on a lockfile or bundle,
`linguist-vendored=false` on a dependency folder.

Allowlist. `TEXT_EXTENSIONS` is the historical list used by `file_selection=allowlist` (and
`shadow`): a file whose extension is not on it is dropped as `non-text`.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from shared.selection.ignorefiles import IGNORE_FILE_CHAIN

SECRET_PATTERNS: tuple[str, ...] = (
    ".env*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".npmrc",
    ".pypirc",
    ".netrc",
    "_netrc",
    ".git-credentials",
    ".pgpass",
    ".htpasswd",
    "kubeconfig",
    "*.kubeconfig",
    "secrets.y*ml",
    "credentials.json",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
)
#: Consecutive path components that are secret together (matched at any depth).
SECRET_PATH_PATTERNS: tuple[str, ...] = (
    ".aws/credentials",
    ".docker/config.json",
)
#: A file whose own name ends with one of these stays reviewable.
SECRET_EXEMPT_SUFFIXES: tuple[str, ...] = (".example", ".sample", ".template")

LOCKFILES: frozenset[str] = frozenset(
    {
        "package-lock.json",
        "npm-shrinkwrap.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "bun.lockb",
        "poetry.lock",
        "uv.lock",
        "Pipfile.lock",
        "pdm.lock",
        "Cargo.lock",
        "go.sum",
        "composer.lock",
        "Gemfile.lock",
        "Podfile.lock",
        "packages.lock.json",
        "mix.lock",
        "pubspec.lock",
        "flake.lock",
        "gradle.lockfile",
        "Package.resolved",
    }
)
DEPENDENCY_DIRS: frozenset[str] = frozenset(
    {
        "node_modules",
        "bower_components",
        "jspm_packages",
        ".venv",
        "venv",
        "site-packages",
        "dist-packages",
        "vendor",
        "__pycache__",
        ".yarn",
        ".pnpm-store",
    }
)
MINIFIED_PATTERNS: tuple[str, ...] = (
    "*.min.js",
    "*.min.mjs",
    "*.min.css",
    "*-min.js",
    "*.bundle.js",
    "*.chunk.js",
    "*.js.map",
    "*.mjs.map",
    "*.css.map",
)

TEXT_EXTENSIONS: frozenset[str] = frozenset(
    {
        # source
        ".py", ".pyi", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java",
        ".kt", ".kts", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cs", ".rb", ".php",
        ".swift", ".scala", ".m", ".mm", ".lua", ".pl", ".pm", ".r", ".jl", ".ex", ".exs",
        ".erl", ".hs", ".clj", ".groovy", ".vue", ".svelte",
        # shell and queries
        ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".sql", ".graphql", ".proto",
        # web and docs
        ".html", ".htm", ".css", ".scss", ".sass", ".less", ".md", ".rst", ".txt", ".adoc",
        # config and data
        ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".xml", ".csv",
        ".properties", ".gradle", ".cmake", ".mk",
    }
)  # fmt: skip


def _component_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


_SECRET_RE = _component_regex(SECRET_PATTERNS)
_LOCKFILES_LOWER = {name.lower(): name for name in LOCKFILES}
_MINIFIED_RE = _component_regex(MINIFIED_PATTERNS)


def _first_match(patterns: tuple[str, ...], name: str) -> str:
    for pattern in patterns:
        if fnmatch.fnmatchcase(name, pattern):
            return pattern
    return patterns[0]  # unreachable when the combined regex matched


def secret_rule(path: str) -> str | None:
    """The secret pattern that denies `path`, or None. Looks at the path only."""
    lowered = path.lower()
    parts = [p for p in lowered.split("/") if p]
    if not parts or parts[-1].endswith(SECRET_EXEMPT_SUFFIXES):
        return None
    for part in parts:
        if _SECRET_RE.match(part):
            return _first_match(SECRET_PATTERNS, part)
    joined = "/" + "/".join(parts)
    for pair in SECRET_PATH_PATTERNS:
        if f"/{pair}/" in joined + "/":
            return pair
    return None


def noise_rule(path: str) -> tuple[str, str] | None:
    """`(kind, rule)` when `path` is noise: kind is `lockfile`, `dependency` or `minified`."""
    parts = [p for p in path.lower().split("/") if p]
    if not parts:
        return None
    name = parts[-1]
    if name in _LOCKFILES_LOWER:
        return "lockfile", _LOCKFILES_LOWER[name]
    for part in parts[:-1]:
        if part in DEPENDENCY_DIRS:
            return "dependency", f"{part}/"
    if _MINIFIED_RE.match(name):
        return "minified", _first_match(MINIFIED_PATTERNS, name)
    return None


def extension_of(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""


def allowlisted(path: str) -> bool:
    """True when the file's extension is on the historical `TEXT_EXTENSIONS` list."""
    return extension_of(path) in TEXT_EXTENSIONS


def is_svg(path: str) -> bool:
    return path.lower().endswith(".svg")


@dataclass(frozen=True)
class DefaultRules:
    secret_patterns: tuple[str, ...] = SECRET_PATTERNS
    secret_path_patterns: tuple[str, ...] = SECRET_PATH_PATTERNS
    secret_exempt_suffixes: tuple[str, ...] = SECRET_EXEMPT_SUFFIXES
    lockfiles: tuple[str, ...] = tuple(sorted(LOCKFILES, key=str.lower))
    dependency_dirs: tuple[str, ...] = tuple(sorted(DEPENDENCY_DIRS))
    minified: tuple[str, ...] = MINIFIED_PATTERNS
    ignore_files: tuple[str, ...] = IGNORE_FILE_CHAIN
    text_extensions: tuple[str, ...] = tuple(sorted(TEXT_EXTENSIONS))


DEFAULT_RULES = DefaultRules()


def default_rules_text() -> str:
    """The compiled-in rules as plain text (what `llm-council ignore --print-defaults` shows)."""
    r = DEFAULT_RULES
    lines = [
        "# Secret boundary (always first; never overridable, not even by naming a path)",
        "# case-insensitive, any depth; a matching directory denies everything below it",
        *r.secret_patterns,
        *r.secret_path_patterns,
        "# exempt (stay reviewable): a file whose name ends with "
        + ", ".join(r.secret_exempt_suffixes),
        "",
        "# Noise (omitted when discovered; re-admit via .gitattributes linguist-*=false)",
        "# lockfiles",
        *r.lockfiles,
        "# dependency folders",
        *(f"{d}/" for d in r.dependency_dirs),
        "# minified bundles and source maps",
        *r.minified,
        "",
        "# Repository ignore files (first present wins, read from the snapshot)",
        *r.ignore_files,
        "",
        "# Also omitted in content mode: linguist-generated, linguist-vendored, binary/-text/"
        "-diff paths, *.svg (unless LLM_COUNCIL_REVIEW_SVG=true), and blobs with a NUL byte "
        "in their first 8000 bytes",
    ]
    return "\n".join(lines) + "\n"
