"""The optional LLM judge of the GEMeX AR-score, over any OpenAI-compatible chat endpoint.

The paper scores answer + reason with GPT-4o in the LLaVA-Med review protocol: the judge sees
the question, the reference as "Assistant 1" and the candidate as "Assistant 2", rates both from
1 to 10 on the first line of its reply, and the score is candidate / reference. Here:

- the endpoint is ``{base_url}/chat/completions`` of any OpenAI-compatible server, with the
  model name given by the user; an API key is read from the environment variable the user
  names (none is sent when it is unset); temperature 0; a ``user:password@`` in the URL is
  sent as HTTP basic authentication (unless a key is), never as part of the address, and the
  URL is shown or saved only with its credentials masked (`builders.secrets.mask_url`);
- the first line of the judge's reply must hold two numbers (commas or spaces between them);
  anything else is a failed judgement, counted and left out of the ratio;
- the score of a set of questions is ``100 * sum(candidate scores) / sum(reference scores)``
  over the judged questions (the ratio of sums, as LLaVA's review summary computes it).

Only the standard library is used (`urllib.request`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from builders.secrets import mask_secrets, mask_url, register_secret, register_secret_env

SYSTEM_PROMPT = "You are a helpful and precise assistant for checking the quality of the answer."
RATING_INSTRUCTION = (
    "We would like to request your feedback on the performance of two AI assistants in response to the "
    "user question displayed above.\nPlease rate the helpfulness, relevance, accuracy, level of details of "
    "their responses. Each assistant receives an overall score on a scale of 1 to 10, where a higher score "
    "indicates better overall performance.\nPlease first output a single line containing only two values "
    "indicating the scores for Assistant 1 and 2, respectively. The two scores are separated by a space.\n"
    "In the subsequent line, please provide a comprehensive explanation of your evaluation, avoiding any "
    "potential bias and ensuring that the order in which the responses were presented does not affect your judgment."
)


class JudgeError(RuntimeError):
    """The judge endpoint could not be reached or answered with something other than a chat completion."""


@dataclass(frozen=True)
class Judgement:
    reference: float
    candidate: float


def judge_prompt(question: str, reference: str, candidate: str) -> str:
    """The user message: question, reference as Assistant 1, candidate as Assistant 2, then the rating rule."""
    return (
        f"[Question]\n{question}\n\n"
        f"[The Start of Assistant 1's Answer]\n{reference}\n\n[The End of Assistant 1's Answer]\n\n"
        f"[The Start of Assistant 2's Answer]\n{candidate}\n\n[The End of Assistant 2's Answer]\n\n"
        f"[System]\n{RATING_INSTRUCTION}\n\n"
    )


def parse_scores(reply: str) -> Judgement | None:
    """The two scores on the first non-empty line of the judge's reply, or None."""
    lines = [line for line in reply.strip().splitlines() if line.strip()]
    if not lines:
        return None
    numbers = re.findall(r"-?\d+(?:\.\d+)?", lines[0])
    if len(numbers) != 2:
        return None
    reference, candidate = (float(n) for n in numbers)
    return Judgement(reference, candidate)


class ChatJudge:
    """A judge behind ``base_url`` (for example ``http://127.0.0.1:8000/v1``) serving `model`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float = 120.0,
        max_tokens: int = 512,
    ):
        self.url, self.basic_auth = judge_endpoint(base_url)
        self.model, self.timeout, self.max_tokens = model, timeout, max_tokens
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        register_secret_env(api_key_env)

    def complete(self, user_message: str) -> str:
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_message}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif self.basic_auth:
            headers["Authorization"] = f"Basic {self.basic_auth}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read())
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError, ValueError, OSError) as error:
            raise JudgeError(mask_secrets(f"judge at {mask_url(self.url)} failed: {error}")) from error
        try:
            return payload["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as error:
            # The reply may echo the request's headers: keys are masked before the text is cut.
            raise JudgeError(
                mask_secrets(
                    f"judge at {mask_url(self.url)} returned no chat completion: {mask_secrets(str(payload))[:200]}"
                )
            ) from error

    def judge(self, question: str, reference: str, candidate: str) -> Judgement | None:
        return parse_scores(self.complete(judge_prompt(question, reference, candidate)))


def judge_endpoint(base_url: str) -> tuple[str, str | None]:
    """The chat-completions URL of `base_url` with any `user:password@` taken out, and those credentials as
    HTTP basic authentication (base64), or None. The password is masked wherever text is shown from then on;
    a URL that is not http(s)://host... is a JudgeError naming it masked."""
    try:
        parts = urllib.parse.urlsplit(base_url.strip())
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise JudgeError(mask_secrets(f"--judge-url {mask_url(base_url)!r} is not a URL: {error}")) from None
    if parts.username is not None or parts.password is not None:
        for value in (parts.password, parts.username):
            register_secret(value)
            register_secret(urllib.parse.unquote(value or ""))
    if parts.scheme not in ("http", "https") or not host:
        raise JudgeError(mask_secrets(f"--judge-url {mask_url(base_url)!r}: expected http(s)://HOST[:PORT]/PATH"))
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port is not None else ""
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/chat/completions", parts.query, ""))
    if parts.username is None and parts.password is None:
        return url, None
    pair = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
    return url, base64.b64encode(pair.encode()).decode()


def relative_score(judgements: Iterable[Judgement | None]) -> tuple[float | None, int]:
    """``100 * sum(candidate) / sum(reference)`` over parsed judgements, and the count that failed to parse."""
    judgements = list(judgements)
    parsed = [j for j in judgements if j is not None]
    failed = len(judgements) - len(parsed)
    reference = sum(j.reference for j in parsed)
    return (100 * sum(j.candidate for j in parsed) / reference if reference > 0 else None), failed
