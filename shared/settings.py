"""Settings, read once at start-up and passed down as values.

Precedence, highest first: explicit overrides (CLI flags), `LLM_COUNCIL_*` environment
variables (and the provider key variables), the repository's `.llm-council.toml`, the
user's `$XDG_CONFIG_HOME/llm-council/config.toml` (default `~/.config/...`), defaults.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from shared.providers.refs import parse_model_ref
from shared.tiers import TIER_SPECS, Tier

REPO_CONFIG_NAME = ".llm-council.toml"
DEFAULT_MODELS = (
    "openrouter:anthropic/claude-sonnet-4.5",
    "openrouter:openai/gpt-5.1",
    "openrouter:google/gemini-2.5-pro",
    "openrouter:x-ai/grok-4",
)
DEFAULT_CHAIRMAN = "openrouter:anthropic/claude-sonnet-4.5"

NO_FALLBACK = "none"

_config_files: ContextVar[tuple[Path, ...]] = ContextVar("_config_files", default=())


class SettingsError(ValueError):
    """Invalid settings; the message names the setting and what was wrong."""


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


CsvList = Annotated[list[str], NoDecode]


class CouncilSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLM_COUNCIL_", extra="ignore", frozen=True, populate_by_name=True
    )

    # Council membership
    models: CsvList = Field(default_factory=lambda: list(DEFAULT_MODELS))
    chairman: str = DEFAULT_CHAIRMAN
    tier_models: dict[Tier, list[str]] = Field(default_factory=dict)
    tier_chairman: dict[Tier, str] = Field(default_factory=dict)
    fallback_chairman: str | None = None
    chairman_disabled: bool = False
    default_tier: Tier = Tier.BALANCED

    # Provider credentials and endpoints
    openrouter_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENROUTER_API_KEY", "openrouter_api_key")
    )
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key")
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_API_KEY", "anthropic_api_key")
    )
    openai_compat_api_key: SecretStr | None = None
    provider_max_attempts: int = Field(default=4, ge=1, le=10)
    provider_backoff_s: float = Field(default=0.5, gt=0.0, le=30.0)
    prompt_caching: bool = True
    prompt_cache_ttl: Literal["5m", "1h"] = "1h"

    # Decision policy
    confidence_threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    structured_findings: bool = True
    min_stage1_reviewers: int = Field(
        default=2,
        ge=1,
        validation_alias=AliasChoices(
            "LLM_COUNCIL_MIN_STAGE1_REVIEWERS", "MIN_STAGE1_REVIEWERS", "min_stage1_reviewers"
        ),
    )

    # Time
    timeout_multiplier: float = Field(default=1.0, gt=0.0, le=20.0)
    per_call_caps: dict[Tier, float] = Field(default_factory=dict)
    chairman_reserve_fraction: float = Field(default=0.3, gt=0.0, lt=1.0)

    # What gets reviewed
    file_selection: Literal["content", "allowlist", "shadow"] = "content"
    review_svg: bool = False
    coverage_policy: Literal["clamp", "warn", "fail"] = "clamp"
    coverage_ack_reasons: CsvList = Field(
        default_factory=lambda: ["binary", "generated", "vendored", "too_large", "ignored", "noise"]
    )
    max_files_expansion: int = Field(default=500, ge=1)
    max_file_chars: int = Field(default=100_000, ge=1)

    # Where things live
    repo_root: Path | None = None
    transcript_dir: Path = Path(".council/logs")
    state_dir: Path = Path(".council")

    # Remote execution and services
    broker_url: str | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str | None = None
    api_token: SecretStr | None = None
    repo_roots: CsvList = Field(default_factory=list)

    @field_validator("models", "coverage_ack_reasons", "repo_roots", mode="before")
    @classmethod
    def _csv(cls, v: Any) -> Any:
        return _split_csv(v)

    @field_validator("models")
    @classmethod
    def _valid_models(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one council model is required")
        for model_id in v:
            parse_model_ref(model_id)
        return v

    @field_validator("chairman")
    @classmethod
    def _valid_chairman(cls, v: str) -> str:
        parse_model_ref(v)
        return v

    @field_validator("fallback_chairman")
    @classmethod
    def _valid_fallback(cls, v: str | None) -> str | None:
        """A model id, unset (the top-ranked stage-1 model) or `none` (no fallback)."""
        if v and v.strip().lower() == NO_FALLBACK:
            return NO_FALLBACK
        if v:
            parse_model_ref(v)
        return v or None

    @field_validator("tier_models")
    @classmethod
    def _valid_tier_models(cls, v: dict[Tier, list[str]]) -> dict[Tier, list[str]]:
        for ids in v.values():
            for model_id in ids:
                parse_model_ref(model_id)
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        files = [TomlConfigSettingsSource(settings_cls, toml_file=p) for p in _config_files.get()]
        return (init_settings, env_settings, *files)

    # Derived views -------------------------------------------------------------------
    def council_for(self, tier: Tier) -> tuple[str, ...]:
        return tuple(self.tier_models.get(tier) or self.models)

    def chairman_for(self, tier: Tier) -> str:
        return self.tier_chairman.get(tier) or self.chairman

    def per_call_cap_s(self, tier: Tier) -> float:
        return self.per_call_caps.get(tier, TIER_SPECS[tier].per_call_cap_s) * (
            self.timeout_multiplier
        )

    @property
    def coverage_policy_explicit(self) -> bool:
        return "coverage_policy" in self.model_fields_set


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llm-council" / "config.toml"


def load_settings(repo: Path | None = None, **overrides: Any) -> CouncilSettings:
    """Read settings once. Raises SettingsError naming the offending setting."""
    files = [p for p in (repo / REPO_CONFIG_NAME if repo else None,) if p and p.is_file()]
    user = user_config_path()
    ordered = tuple(files) + ((user,) if user.is_file() else ())
    token = _config_files.set(ordered)
    try:
        return CouncilSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc)) from None
    finally:
        _config_files.reset(token)


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        name = ".".join(str(p) for p in err["loc"]) or "settings"
        env = f"LLM_COUNCIL_{name.split('.')[0].upper()}"
        parts.append(f"invalid setting {env}: {err['msg']}")
    return "; ".join(parts)
