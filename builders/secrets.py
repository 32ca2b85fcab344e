"""Keys and tokens never reach the screen or a log: `mask_secrets` on anything shown to the user.

Masked: the value after `Bearer ` or `Basic ` (an echoed Authorization header), anything shaped like a
Hugging Face token (`hf_...`) or an OpenAI-style key (`sk-...`), credentials in a URL (the
`user:password@` before its host, the value of a query or fragment parameter whose name ends like a
key: `api_key=`, `authToken=`, `clientSecret=`, `#access_token=`, `X-Amz-Signature=`, ...), the values of the environment variables that
hold the Hub token and API keys (`SECRET_ENV`, plus any the user names, e.g. `--judge-api-key-env`,
registered with `register_secret_env`), and values registered with `register_secret` (a
password taken out of a URL).
"""

from __future__ import annotations

import argparse
import logging
import os
import re

MASK = "***"
SECRET_ENV = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY"]
_BEARER = re.compile(r"(\b(?:Bearer|Basic)\s+)[^\s'\",;}\]]+", re.IGNORECASE)
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
_API_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#'\"<>]+@")
"""Up to the authority's last `@`: a password may hold one (`http://u:p@ss@host`, as `urlsplit` reads it)."""
_URL_SECRET_PARAM = re.compile(
    r"([?&;#][A-Za-z0-9._-]*?(?:key|token|secret|password|passwd|pwd|auth|authorization|signature|sig|"
    r"credential|session)=)[^\s&#'\"<>]+",
    re.IGNORECASE,
)
"""A query or fragment (OAuth's `#access_token=`) parameter whose name ends like a key, in any spelling:
`api_key`, `accessKey`, `authToken`, `authtoken`, `clientSecret`, `X-Amz-Signature`..."""
_VALUES: set[str] = set()
_MIN_SECRET = 6
"""Shorter values are not masked one by one (masking every "abc" in a message would hide more than keys)."""


def register_secret_env(name: str | None) -> None:
    """Also mask the value of environment variable `name` from now on."""
    if name and name not in SECRET_ENV:
        SECRET_ENV.append(name)


def register_secret(value: str | None) -> None:
    """Also mask `value` itself from now on (at least `_MIN_SECRET` characters, like the environment's)."""
    if value and len(value) >= _MIN_SECRET:
        _VALUES.add(value)


def mask_secrets(text: str) -> str:
    """`text` with every bearer key, Hub token, URL credential and secret value replaced by `***`."""
    values = sorted({*_VALUES, *(os.environ.get(name) or "" for name in SECRET_ENV)}, key=len, reverse=True)
    for value in values:
        if len(value) >= _MIN_SECRET:
            text = text.replace(value, MASK)
    text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    text = _API_KEY.sub("sk-" + MASK, text)
    text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _URL_SECRET_PARAM.sub(lambda m: m.group(1) + MASK, text)
    return _HF_TOKEN.sub("hf_" + MASK, text)


def mask_url(url: str) -> str:
    """A URL as it may be shown or saved: its credentials (`user:password@`, key-like query values) masked."""
    return mask_secrets(url)


class MaskingArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose error lines are masked: they echo the offending value
    (`invalid int value: 'hf_...'`), which may be a key pasted in the wrong place.
    Its subparsers are of this class too (`add_subparsers` uses the parent's class)."""

    def error(self, message: str):
        super().error(mask_secrets(message))


class MaskSecrets(logging.Filter):
    """A logging filter that masks secrets in each record's final message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def mask_logged_secrets(logger: str = "cxr_vqa") -> None:
    """Mask secrets in what the project's logger records (once per process)."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, MaskSecrets) for f in target.filters):
        target.addFilter(MaskSecrets())
