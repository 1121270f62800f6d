"""Settings: precedence, validation errors that name the setting, derived views."""

from __future__ import annotations

import pytest

from shared.settings import SettingsError, load_settings
from shared.tiers import Tier


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_defaults(tmp_path):
    s = load_settings(tmp_path)
    assert s.default_tier is Tier.BALANCED
    assert s.confidence_threshold == 0.7
    assert s.structured_findings is True
    assert s.min_stage1_reviewers == 2
    assert s.coverage_policy == "clamp" and not s.coverage_policy_explicit
    assert len(s.models) == 4


def test_precedence_flags_env_repo_user(tmp_path, monkeypatch):
    user = tmp_path / "xdg" / "llm-council" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    _write(
        user, 'confidence_threshold = 0.5\nchairman = "openai:user-chair"\ndefault_tier = "high"\n'
    )
    assert load_settings(tmp_path).confidence_threshold == 0.5
    _write(tmp_path / ".llm-council.toml", "confidence_threshold = 0.6\n")
    s = load_settings(tmp_path)
    assert s.confidence_threshold == 0.6  # the repository's file beats the user's
    assert s.chairman == "openai:user-chair"  # what the repo file leaves out still comes through
    monkeypatch.setenv("LLM_COUNCIL_CONFIDENCE_THRESHOLD", "0.8")
    assert load_settings(tmp_path).confidence_threshold == 0.8  # env beats files
    assert load_settings(tmp_path, confidence_threshold=0.9).confidence_threshold == 0.9


def test_env_lists_are_comma_separated(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_COUNCIL_MODELS", "openai:a, anthropic:b")
    monkeypatch.setenv("MIN_STAGE1_REVIEWERS", "3")
    s = load_settings(tmp_path)
    assert s.models == ["openai:a", "anthropic:b"]
    assert s.min_stage1_reviewers == 3


def test_tier_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_COUNCIL_TIER_MODELS", '{"quick": ["openai:mini"]}')
    monkeypatch.setenv("LLM_COUNCIL_TIER_CHAIRMAN", '{"quick": "openai:mini"}')
    s = load_settings(tmp_path)
    assert s.council_for(Tier.QUICK) == ("openai:mini",)
    assert s.chairman_for(Tier.QUICK) == "openai:mini"
    assert s.council_for(Tier.HIGH) == tuple(s.models)


@pytest.mark.parametrize(
    ("env", "value", "named"),
    [
        ("LLM_COUNCIL_CONFIDENCE_THRESHOLD", "1.5", "LLM_COUNCIL_CONFIDENCE_THRESHOLD"),
        ("LLM_COUNCIL_MODELS", "not-a-model", "LLM_COUNCIL_MODELS"),
        ("LLM_COUNCIL_CHAIRMAN", "bogus:x", "LLM_COUNCIL_CHAIRMAN"),
        ("LLM_COUNCIL_DEFAULT_TIER", "ultra", "LLM_COUNCIL_DEFAULT_TIER"),
        ("LLM_COUNCIL_COVERAGE_POLICY", "ignore", "LLM_COUNCIL_COVERAGE_POLICY"),
        ("LLM_COUNCIL_TIMEOUT_MULTIPLIER", "0", "LLM_COUNCIL_TIMEOUT_MULTIPLIER"),
        ("LLM_COUNCIL_FILE_SELECTION", "everything", "LLM_COUNCIL_FILE_SELECTION"),
    ],
)
def test_invalid_settings_fail_naming_the_setting(tmp_path, monkeypatch, env, value, named):
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError, match=named):
        load_settings(tmp_path)


def test_invalid_config_file_value_is_named(tmp_path):
    _write(tmp_path / ".llm-council.toml", 'min_stage1_reviewers = "many"\n')
    with pytest.raises(SettingsError, match="MIN_STAGE1_REVIEWERS"):
        load_settings(tmp_path)


def test_explicit_warn_policy_is_detectable(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_COUNCIL_COVERAGE_POLICY", "warn")
    assert load_settings(tmp_path).coverage_policy_explicit


def test_keys_are_secret_in_repr(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-very-secret")
    s = load_settings(tmp_path)
    assert "sk-or-very-secret" not in repr(s)
    assert s.openrouter_api_key is not None
    assert s.openrouter_api_key.get_secret_value() == "sk-or-very-secret"


def test_fallback_chairman_none(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_COUNCIL_FALLBACK_CHAIRMAN", "None")
    assert load_settings(tmp_path).fallback_chairman == "none"
