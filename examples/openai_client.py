"""An agent's two turns through PEARL's gateway with the `openai` SDK, unchanged.

    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1] [--api-key KEY]

The session header keeps both turns on the worker that holds the conversation's prefix;
``return_token_ids`` asks for the exact tokens (vLLM's name), and each choice says which weights
version produced them (docs/gateway.md).
"""

import argparse

from openai import OpenAI


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none", help="the gateway's key, when it has one")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=5)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    for turn in (1, 2):
        r = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=24,
            extra_headers={"X-Session-ID": "example-session"},
            extra_body={"return_token_ids": True},
        )
        choice = r.choices[0]
        extra = choice.model_extra or {}
        print(f"turn {turn}: {len(extra.get('token_ids') or [])} tokens, weights version "
              f"{extra.get('weight_version')}, finish {choice.finish_reason}: "
              f"{choice.message.content!r}")  # fmt: skip
        messages += [
            {"role": "assistant", "content": choice.message.content or ""},
            {"role": "user", "content": "And times 4?"},
        ]


if __name__ == "__main__":
    main()
