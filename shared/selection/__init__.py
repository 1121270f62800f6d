"""What gets reviewed: the subject of a verification, resolved from a git commit.

`resolve_subject` reads the files of a commit (never the work tree), applies the layered
filter (secret boundary first, then the repository's ignore file, attributes, noise, file
selection mode, content and size) and returns a `Subject` with its `CoverageReceipt`.
See `resolve` and `classify` for the decisions, `rules` for the compiled-in patterns.
"""

from shared.selection.errors import CoveragePolicyError, SubjectError
from shared.selection.ignorefiles import IGNORE_FILE_CHAIN, STARTER_TEXT
from shared.selection.resolve import (
    Explanation,
    PathExplanation,
    explain_path,
    input_too_large_message,
    normalize_path,
    resolve_subject,
)
from shared.selection.rules import (
    DEFAULT_RULES,
    TEXT_EXTENSIONS,
    DefaultRules,
    allowlisted,
    default_rules_text,
    noise_rule,
    secret_rule,
)

__all__ = [
    "DEFAULT_RULES",
    "IGNORE_FILE_CHAIN",
    "STARTER_TEXT",
    "TEXT_EXTENSIONS",
    "CoveragePolicyError",
    "DefaultRules",
    "Explanation",
    "PathExplanation",
    "SubjectError",
    "allowlisted",
    "default_rules_text",
    "explain_path",
    "input_too_large_message",
    "noise_rule",
    "normalize_path",
    "resolve_subject",
    "secret_rule",
]
