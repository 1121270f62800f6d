"""Pure selection rules: secret boundary, exemptions, noise, allowlist, classification."""

from __future__ import annotations

import pytest

from shared.selection import (
    DEFAULT_RULES,
    SubjectError,
    allowlisted,
    default_rules_text,
    input_too_large_message,
    noise_rule,
    normalize_path,
    secret_rule,
)
from shared.selection.classify import (
    NO_ATTRS,
    Attrs,
    blob_facts,
    content_decision,
    interpret_attributes,
    path_decision,
)
from shared.selection.ignorefiles import IgnoreRules
from shared.subject import Subject, SubjectFile

SECRETS = [
    ".env",
    ".env.local",
    ".env.production",
    "config/.ENV.production",
    "deep/a/b/c/.Env",
    "server.pem",
    "certs/Server.PEM",
    "tls/private.key",
    "id_rsa",
    "home/.ssh/id_rsa.pub",
    "ID_ED25519",
    "keys/id_ed25519_work",
    ".npmrc",
    "frontend/.npmrc",
    ".pypirc",
    ".netrc",
    ".git-credentials",
    ".aws/credentials",
    "ops/.AWS/Credentials",
    "kubeconfig",
    "clusters/prod.kubeconfig",
    "KUBECONFIG",
    "secrets.yml",
    "secrets.yaml",
    "helm/Secrets.YAML",
    "credentials.json",
    "gcp/Credentials.json",
    "cert.p12",
    "store.PFX",
    ".envs/.production/.django",  # a matching directory denies everything below it
]

NOT_SECRETS = [
    ".env.example",
    "config/.ENV.Example",
    ".env.sample",
    ".env.template",
    "secrets.yaml.template",
    "id_rsa.sample",
    "src/env.py",
    "docs/environment.md",
    "keyboard.py",
    "src/keys.py",
    "credentials.py",
    "aws/credentials.md",
    "my.kubeconfig.md",
    "secrets.json",
    "README.md",
]


@pytest.mark.parametrize("path", SECRETS)
def test_secret_boundary_denies(path):
    assert secret_rule(path) is not None, path


@pytest.mark.parametrize("path", NOT_SECRETS)
def test_secret_boundary_allows(path):
    assert secret_rule(path) is None, path


def test_secret_rule_names_the_pattern():
    assert secret_rule("config/.ENV.production") == ".env*"
    assert secret_rule("a/b/.aws/credentials") == ".aws/credentials"
    assert secret_rule("x/secrets.yml") == "secrets.y*ml"


def test_secret_boundary_lists_at_least_the_required_patterns():
    required = {
        ".env*",
        "*.pem",
        "*.key",
        "id_rsa*",
        "id_ed25519*",
        ".npmrc",
        ".pypirc",
        ".netrc",
        ".git-credentials",
        "kubeconfig",
        "*.kubeconfig",
        "secrets.y*ml",
        "credentials.json",
        "*.p12",
        "*.pfx",
    }
    assert required <= set(DEFAULT_RULES.secret_patterns)
    assert ".aws/credentials" in DEFAULT_RULES.secret_path_patterns


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("package-lock.json", "lockfile"),
        ("web/yarn.lock", "lockfile"),
        ("pnpm-lock.yaml", "lockfile"),
        ("poetry.lock", "lockfile"),
        ("uv.lock", "lockfile"),
        ("Pipfile.lock", "lockfile"),
        ("rust/Cargo.lock", "lockfile"),
        ("go.sum", "lockfile"),
        ("composer.lock", "lockfile"),
        ("Gemfile.lock", "lockfile"),
        ("node_modules/left-pad/index.js", "dependency"),
        ("web/bower_components/x/y.js", "dependency"),
        (".venv/lib/python3.11/site-packages/a.py", "dependency"),
        ("venv/bin/activate", "dependency"),
        ("vendor/github.com/x/y.go", "dependency"),
        ("static/app.min.js", "minified"),
        ("static/app.min.css", "minified"),
        ("dist/main.bundle.js", "minified"),
        ("dist/main.js.map", "minified"),
    ],
)
def test_noise(path, kind):
    hit = noise_rule(path)
    assert hit is not None and hit[0] == kind


@pytest.mark.parametrize(
    "path", ["src/app.py", "go.mod", "package.json", "src/vendor.py", "lib/minify.js"]
)
def test_not_noise(path):
    assert noise_rule(path) is None


@pytest.mark.parametrize(
    "path", ["a.py", "b.TS", "c.tsx", "x/y.go", "Cargo.toml", "README.md", "conf.yaml", "s.sh"]
)
def test_allowlist_keeps(path):
    assert allowlisted(path)


@pytest.mark.parametrize("path", ["main.zig", "infra/main.tf", "lib.dart", "LICENSE", "Makefile"])
def test_allowlist_drops(path):
    assert not allowlisted(path)


def test_default_rules_text_lists_everything():
    text = default_rules_text()
    for needle in (
        ".env*",
        "id_rsa*",
        ".aws/credentials",
        "package-lock.json",
        "node_modules/",
        "*.min.js",
        ".llmignore",
        ".codeiumignore",
        ".example",
    ):
        assert needle in text


# Paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("src/a.py", "src/a.py"),
        ("./src//a.py", "src/a.py"),
        ("src/", "src"),
        (".", ""),
        ("./", ""),
    ],
)
def test_normalize_path(raw, norm):
    assert normalize_path(raw) == norm


@pytest.mark.parametrize(
    "raw", ["../x", "src/../../etc/passwd", "a/..", "/etc/passwd", "C:/x", "", "  ", "a\nb"]
)
def test_normalize_path_refuses(raw):
    with pytest.raises(SubjectError) as info:
        normalize_path(raw)
    assert "\n" not in str(info.value)


# Classification --------------------------------------------------------------------------


def test_interpret_attributes():
    binary = interpret_attributes({"binary": "set", "text": "unset", "diff": "unset"})
    assert binary.binary == "binary" and not binary.forced_text
    assert interpret_attributes({"text": "unset"}).binary == "-text"
    assert interpret_attributes({"diff": "unset"}).binary == "-diff"
    assert interpret_attributes({"text": "set"}).forced_text
    assert interpret_attributes({"linguist-generated": "set"}).generated is True
    assert interpret_attributes({"linguist-generated": "true"}).generated is True
    assert interpret_attributes({"linguist-generated": "false"}).generated is False
    assert interpret_attributes({"linguist-vendored": "unset"}).vendored is False
    assert interpret_attributes({"linguist-vendored": "unspecified"}).vendored is None


def _decide(
    path,
    *,
    origin="discovered",
    attrs=NO_ATTRS,
    ignore=None,
    mode="content",
    svg=False,
    git_mode="100644",
):
    d = path_decision(
        path,
        git_mode,
        origin=origin,
        attrs=attrs,
        ignore=ignore or IgnoreRules(),
        selection=mode,
        review_svg=svg,
    )
    return None if d is None else d.reason


def test_path_decision_order():
    ignore = IgnoreRules.parse(".llmignore", "!.env\n*.log\n")
    assert _decide(".env", ignore=ignore) == "denied_secret"
    assert _decide(".env", origin="explicit", ignore=ignore) == "denied_secret"
    assert _decide("a.log", origin="explicit", ignore=ignore) == "ignored"
    assert _decide("gen.py", attrs=Attrs(generated=True)) == "generated"
    assert _decide("gen.py", attrs=Attrs(generated=True), origin="explicit") is None
    assert _decide("lib.c", attrs=Attrs(vendored=True)) == "vendored"
    assert _decide("yarn.lock") == "noise"
    assert _decide("yarn.lock", attrs=Attrs(generated=False)) is None
    assert _decide("node_modules/a.js", attrs=Attrs(vendored=False)) is None
    assert _decide("logo.svg") == "binary"
    assert _decide("logo.svg", svg=True) is None
    assert _decide("logo.svg", mode="allowlist") == "non-text"
    assert _decide("a.py", attrs=Attrs(binary="-text")) == "binary"
    assert _decide("a.py", attrs=Attrs(binary="binary"), origin="explicit") == "binary"
    assert _decide("main.zig", mode="allowlist") == "non-text"
    assert _decide("main.zig") is None
    assert _decide("sub", git_mode="160000") == "non-text"
    assert _decide("link.zig", git_mode="120000", mode="allowlist") is None


def test_ignore_rules_report_line():
    rules = IgnoreRules.parse(".aiexclude", "# header\n\nbuild/\n*.snap\n!keep.snap\n")
    assert rules.match("build/x.py") == (3, "build/")
    assert rules.match("a/b.snap") == (4, "*.snap")
    assert rules.match("keep.snap") is None
    assert rules.match("src/a.py") is None
    assert IgnoreRules().match("anything") is None


def _reason(facts, attrs=NO_ATTRS, max_chars=100):
    return content_decision("100644", attrs, facts, max_chars=max_chars, selection="content")


def test_blob_facts_and_content_decision():
    text = blob_facts(5, b"hello", b"hello")
    assert _reason(text, max_chars=10)[1] == "hello"
    assert _reason(text, max_chars=4)[0].reason == "too_large"
    nul = blob_facts(3, b"a\0b", b"a\0b")
    assert _reason(nul)[0].reason == "binary"
    assert _reason(nul, Attrs(forced_text=True))[0].reviewed
    big = blob_facts(10_000_000, b"x" * 100, None)
    assert _reason(big)[0].reason == "too_large"
    latin = blob_facts(6, b"caf\xe9 x", b"caf\xe9 x")
    d, body = _reason(latin)
    assert d.reviewed and body == "caf\ufffd x"
    sjis = "日本語のテキストです".encode("shift_jis")
    assert _reason(blob_facts(len(sjis), sjis, sjis))[0].reason == "garbage"
    bom = blob_facts(6, b"\xef\xbb\xbfabc", b"\xef\xbb\xbfabc")
    assert bom.text == "abc"


def test_symlink_content_is_labelled_link_text():
    facts = blob_facts(11, b"/etc/passwd", b"/etc/passwd")
    d, body = content_decision("120000", NO_ATTRS, facts, max_chars=100, selection="allowlist")
    assert d.reviewed and body is not None
    assert "symbolic link" in body and "-> /etc/passwd" in body


def test_input_too_large_message():
    subject = Subject(
        snapshot_requested="HEAD",
        snapshot_resolved="0" * 40,
        files=(
            SubjectFile(path="big.py", content="x" * 700),
            SubjectFile(path="small.py", content="y" * 400),
        ),
    )
    assert input_too_large_message(subject, 2000) is None
    msg = input_too_large_message(subject, 1000)
    assert msg is not None
    assert "1,100" in msg and "100 over" in msg and "1,000" in msg
    assert msg.index("big.py") < msg.index("small.py")
    assert "\n" not in msg
